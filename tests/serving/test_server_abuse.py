"""The reference server under abuse: one table, one row per hostile request (issue 11 items 6, 17, 25).

Each row: the request, the status it must get, and a substring of the error message. Errors must
come in OpenAI's shape ``{"error": {"message", "type", "code"}}`` (JSON for a status, an SSE
``data: {"error": ...}`` event when the 200 headers of a stream were already sent). Never a 500
for bad input, never a connection reset.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
USER = [{"role": "user", "content": "x"}]
FAILS = {"temperature": 0, "ignore_eos": True}  # always reaches the failing second step (a sampled EOS would not)


@dataclass
class Case:
    id: str
    path: str
    body: Any  # a dict (sent as JSON), or bytes / a list of byte chunks sent as they are
    status: int
    message: str  # substring of error.message ("" for a 200 row)
    app: dict = field(default_factory=dict)  # create_app options, or engine=closed / failing
    sse_error: bool = False  # 200 headers, then the error as an SSE event


CASES = [
    # token ids the model does not have
    Case("ids-at-vocab", COMP, {"prompt": [1, 256], "max_tokens": 2}, 400, "token id 256 is out of range (0 <= id < 256)"),
    Case("ids-negative", COMP, {"prompt": [-1], "max_tokens": 2}, 400, "token id -1 is out of range"),
    Case("ids-2**70", COMP, {"prompt": [2**70], "max_tokens": 2}, 400, f"token id {2**70} is out of range"),
    Case("ids-2**70-streamed", COMP, {"prompt": [2**70], "max_tokens": 2, "stream": True}, 400, "out of range"),
    Case("ids-bool", COMP, {"prompt": [True], "max_tokens": 2}, 400, "prompt"),
    Case("ids-nested", COMP, {"prompt": [[1, 2]], "max_tokens": 2}, 400, "prompt"),
    # seeds torch cannot take
    Case("seed-2**70", COMP, {"prompt": "x", "seed": 2**70, "max_tokens": 2}, 400, "seed: Input should be less than"),
    Case("seed-2**70-streamed", CHAT, {"messages": USER, "seed": 2**70, "stream": True}, 400, "seed"),
    Case("seed-negative-ok", COMP, {"prompt": "x", "seed": -1, "max_tokens": 2, "temperature": 1}, 200, ""),
    # chat content that is not text
    Case("chat-part-text-int", CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
         400, "messages.0.content"),
    Case("chat-part-image", CHAT, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, 400, "only text content parts"),
    Case("chat-content-int", CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "messages.0.content"),
    Case("chat-role-missing", CHAT, {"messages": [{"content": "x"}]}, 400, "messages.0.role"),
    Case("chat-messages-string", CHAT, {"messages": "hello"}, 400, "messages"),
    Case("chat-messages-empty", CHAT, {"messages": []}, 400, "messages"),
    Case("chat-parts-ok", CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
                                 "max_tokens": 2}, 200, ""),
    # bodies that are not what they should be
    Case("body-not-json", CHAT, b"{not json", 400, "not valid JSON"),
    Case("body-not-utf8", CHAT, b"\xff\xfe{", 400, "not valid JSON"),
    Case("body-a-list", CHAT, b"[]", 400, "must be a JSON object"),
    Case("body-deeply-nested", COMP, b"[" * 200000 + b"]" * 200000, 400, "not valid JSON"),
    Case("body-nan-temperature", COMP, b'{"prompt": "x", "temperature": NaN}', 400, "temperature"),
    Case("body-inf-top-p", COMP, b'{"prompt": "x", "top_p": Infinity}', 400, "top_p"),
    Case("stop-not-text", COMP, {"prompt": "x", "stop": [5]}, 400, "stop"),
    Case("max-tokens-zero", COMP, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    Case("n-2", COMP, {"prompt": "x", "n": 2}, 400, "only n = 1"),
    Case("batch-prompts", COMP, {"prompt": ["a", "b"]}, 400, "one prompt per request"),
    Case("unknown-model", CHAT, {"model": "gpt-4", "messages": USER}, 404, "is not served here"),
    # longer than the target's context (max_position_embeddings 2048), as vLLM refuses it
    Case("prompt-over-context", COMP, {"prompt": [65] * 2100, "max_tokens": 2}, 400,
         "maximum context length is 2048 tokens. However, you requested 2102 tokens (2100 in the prompt, 2 in"),
    Case("max-tokens-over-context", COMP, {"prompt": "x", "max_tokens": 2**70}, 400, "maximum context length is 2048"),
    Case("recipe-max-seq-len", COMP, {"prompt": [65] * 60, "max_tokens": 8}, 400, "maximum context length is 64",
         app={"max_model_len": 64}),
    # parameters the server would otherwise ignore: refused by name
    Case("tools", CHAT, {"messages": USER, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400,
         "tools: tool calling is not implemented"),
    Case("tool-choice", CHAT, {"messages": USER, "tool_choice": "auto"}, 400, "tool_choice"),
    Case("tool-choice-none-ok", CHAT, {"messages": USER, "tool_choice": "none", "max_tokens": 2}, 200, ""),
    Case("response-format-json", CHAT, {"messages": USER, "response_format": {"type": "json_object"}}, 400,
         "response_format"),
    Case("response-format-text-ok", CHAT, {"messages": USER, "response_format": {"type": "text"}, "max_tokens": 2},
         200, ""),
    Case("logit-bias", COMP, {"prompt": "x", "logit_bias": {"65": 100}}, 400, "logit_bias"),
    Case("presence-penalty", COMP, {"prompt": "x", "presence_penalty": 0.5}, 400, "presence_penalty"),
    Case("frequency-penalty", CHAT, {"messages": USER, "frequency_penalty": 1}, 400, "frequency_penalty"),
    Case("best-of", COMP, {"prompt": "x", "best_of": 3}, 400, "best_of"),
    Case("suffix", COMP, {"prompt": "x", "suffix": "end"}, 400, "suffix"),
    Case("echo-with-logprobs", COMP, {"prompt": "x", "echo": True, "logprobs": 1}, 400, "echo"),
    Case("logprobs-21", COMP, {"prompt": "x", "logprobs": 21}, 400, "logprobs"),
    Case("top-logprobs-without-logprobs", CHAT, {"messages": USER, "top_logprobs": 2}, 400,
         "top_logprobs: requires logprobs: true"),
    Case("top-logprobs-21", CHAT, {"messages": USER, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    Case("user-field-ok", CHAT, {"messages": USER, "user": "me", "max_tokens": 2}, 200, ""),
    # limits: body size, queue, shutdown
    Case("body-over-limit", COMP, {"prompt": "x" * 4000}, 413, "larger than 1024 bytes", app={"max_body_bytes": 1024}),
    Case("chunked-body-over-limit", COMP, [b'{"prompt": "', b"x" * 3000, b'"}'], 413, "larger than 1024 bytes",
         app={"max_body_bytes": 1024}),
    Case("queue-full", COMP, {"prompt": "x"}, 429, "already waiting", app={"max_queued": 0}),
    Case("shutting-down", CHAT, {"messages": USER}, 503, "shutting down", app={"engine": "closed"}),
    # failures after the stream's headers: an SSE error event, then [DONE]
    Case("decoder-fails-streamed", COMP, {"prompt": "x", "max_tokens": 9, "stream": True, **FAILS}, 200,
         "internal error: RuntimeError: injected", app={"engine": "failing"}, sse_error=True),
    Case("decoder-fails-chat-streamed", CHAT, {"messages": USER, "max_tokens": 9, "stream": True, **FAILS}, 200,
         "internal error: RuntimeError: injected", app={"engine": "failing"}, sse_error=True),
    Case("decoder-fails", COMP, {"prompt": "x", "max_tokens": 9, **FAILS}, 500, "internal error: RuntimeError: injected",
         app={"engine": "failing"}),
]


@pytest.fixture(scope="module")
def engine(built_bundle):
    import torch

    from specconvert.serving.engine import load_engine

    torch.set_num_threads(1)
    root, _ = built_bundle
    return load_engine(root / "work" / "engine", "tiny-serve", device="cpu")


class FailingDecoder:
    """Wraps the real decoder; raises at the second step (what a bug or an OOM in the worker looks like)."""

    def __init__(self, inner):
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.eos_token_ids = inner.eos_token_ids
        self.target = inner.target

    def stream(self, prompt_ids, max_new_tokens, settings):
        for i, step in enumerate(self.inner.stream(prompt_ids, max_new_tokens, settings)):
            if i == 1:
                raise RuntimeError("injected")
            yield step


def _engine_for(engine, kind: str | None):
    from specconvert.serving.engine import ReferenceEngine

    if kind is None:
        return engine
    if kind == "closed":
        closed = ReferenceEngine(engine.decoder, engine.model_name, engine.max_draft_len)
        closed.close()
        return closed
    return ReferenceEngine(FailingDecoder(engine.decoder), engine.model_name, 1)


async def _send(app, case: Case):
    import httpx

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=60) as http:
        if isinstance(case.body, dict):
            kwargs = {"json": case.body}
        elif isinstance(case.body, list):
            chunks = case.body

            async def gen():
                for c in chunks:
                    yield c
            kwargs = {"content": gen(), "headers": {"content-type": "application/json"}}
        else:
            kwargs = {"content": case.body, "headers": {"content-type": "application/json"}}
        async with http.stream("POST", case.path, **kwargs) as response:
            raw = await response.aread()
            return response.status_code, response.headers.get("content-type", ""), raw.decode()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_abuse(case, engine):
    from specconvert.serving.app import create_app

    options = dict(case.app)
    app = create_app(_engine_for(engine, options.pop("engine", None)), **options)
    status, content_type, text = asyncio.run(_send(app, case))
    assert status == case.status, text[:500]
    if case.sse_error:
        assert content_type.startswith("text/event-stream")
        events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]", events[-3:]
        errors = [json.loads(e)["error"] for e in events[:-1] if "error" in json.loads(e)]
        assert len(errors) == 1 and case.message in errors[0]["message"], errors
        assert errors[0]["type"] == "server_error" and errors[0]["code"] == 500
        return
    body = json.loads(text)
    if status == 200:
        assert body["choices"][0]["finish_reason"] in ("length", "stop") and "error" not in body
        return
    assert content_type.startswith("application/json")
    err = body["error"]
    assert set(err) >= {"message", "type", "code"} and err["code"] == status
    assert case.message in err["message"], err["message"]
    assert "\n" not in err["message"]

