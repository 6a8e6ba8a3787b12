"""OpenAI request and response shapes of the reference server: what it accepts, what it refuses, logprobs.

Request models validate every field the server acts on (a bad value is a 400 that names
the field, never a 500). Fields that OpenAI defines but the reference decoder cannot honour
(tools, logit_bias, response formats, penalties, ...) are refused with a 400 naming the
parameter: a client must never believe a constraint was applied when it was not. Other
unknown fields (``user``, ``metadata``, vendor extensions) are accepted and ignored.

Log-probabilities are the TARGET model's log-softmax over its raw logits at each emitted
position (before temperature, top-k and top-p, as OpenAI and vLLM report them); on the
speculative path they come from the verify forward. Shapes:

- completions (``logprobs: N``): ``choices[].logprobs = {tokens, token_logprobs,
  top_logprobs: [{token: logprob, ...}], text_offset}``, N most likely per position;
- chat (``logprobs: true``, ``top_logprobs: N``): ``choices[].logprobs.content =
  [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]``.

A token is its text, or ``token_id:N`` when the request sets vLLM's ``return_tokens_as_token_ids``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence, Union

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator

MAX_LOGPROBS = 20  # OpenAI's bound for top_logprobs (and vLLM's default max_logprobs)
INT64_MIN, UINT64_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed takes

# Each refused parameter: (is it set to something we would ignore?, why / what to do instead).
_REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "tools": (lambda v: bool(v), "tool calling is not implemented by the reference server"),
    "tool_choice": (lambda v: v not in (None, "none"), "tool calling is not implemented by the reference server"),
    "functions": (lambda v: bool(v), "function calling is not implemented by the reference server"),
    "function_call": (lambda v: v not in (None, "none"), "function calling is not implemented by the reference server"),
    "logit_bias": (lambda v: bool(v), "logit_bias is not applied by the reference decoder"),
    "response_format": (lambda v: not (isinstance(v, dict) and v.get("type", "text") == "text") and v is not None,
                        "only response_format {\"type\": \"text\"} is supported (no JSON mode or schemas)"),
    "presence_penalty": (lambda v: v not in (None, 0, 0.0), "penalties are not applied by the reference decoder"),
    "frequency_penalty": (lambda v: v not in (None, 0, 0.0), "penalties are not applied by the reference decoder"),
    "repetition_penalty": (lambda v: v not in (None, 1, 1.0), "penalties are not applied by the reference decoder"),
    "best_of": (lambda v: v not in (None, 1), "best_of > 1 is not supported (one sequence per request)"),
    "suffix": (lambda v: bool(v), "suffix (insertion) is not supported"),
}


def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None) -> JSONResponse:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return JSONResponse(status_code=status, content=error_body(status, message, kind, param))


def error_body(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


class BaseRequest(BaseModel):
    # OpenAI clients send fields we do not act on (user, metadata, ...): accept them; refused ones are in _REFUSED.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    seed: int | None = Field(None, ge=INT64_MIN, le=UINT64_MAX)
    stop: Union[StrictStr, list[StrictStr], None] = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = 1
    speculative: bool | None = None  # extension: false = the plain target
    ignore_eos: bool = False
    # vLLM's extension, same name and spelling (vllm 0.32 entrypoints/openai/chat_completion/protocol.py and
    # completion/protocol.py; format_token_id_placeholder in entrypoints/generate/base/serving.py): logprob
    # tokens as "token_id:N", so a client finds a token by id (serve-test's tie rule does) instead of by text.
    return_tokens_as_token_ids: bool | None = None

    def refused(self) -> tuple[str, str] | None:
        """(parameter, reason) of the first parameter set to something the server would silently ignore."""
        extra = self.model_extra or {}
        for name, (is_set, why) in _REFUSED.items():
            if name in extra and is_set(extra[name]):
                return name, why
        return None

    def top_logprobs_wanted(self) -> int | None:  # overridden per endpoint
        return None


class CompletionRequest(BaseRequest):
    prompt: Union[StrictStr, list[StrictInt], list[StrictStr]]
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False

    def top_logprobs_wanted(self) -> int | None:
        return self.logprobs


class _TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: StrictStr = "text"
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: StrictStr
    content: Union[StrictStr, list[_TextPart], None] = ""

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any) -> Any:
        if isinstance(value, list):
            for i, part in enumerate(value):
                kind = part.get("type", "text") if isinstance(part, dict) else None
                if kind != "text":
                    raise ValueError(f"part {i}: only text content parts are supported, not {kind!r}")
        return value

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatRequest(BaseRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    def top_logprobs_wanted(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


def check_request(body: BaseRequest) -> JSONResponse | None:
    """The 400 for a request that is well-formed but asks for something the server does not do."""
    if body.n != 1:
        return error(400, "n: only n = 1 is supported by the reference server", param="n")
    refused = body.refused()
    if refused:
        name, why = refused
        return error(400, f"{name}: {why}; remove the parameter", param=name)
    if isinstance(body, ChatRequest) and body.top_logprobs is not None and not body.logprobs:
        return error(400, "top_logprobs: requires logprobs: true", param="top_logprobs")
    if isinstance(body, CompletionRequest) and body.echo and body.logprobs is not None:
        return error(400, "echo: not supported together with logprobs (prompt log-probabilities are not computed)",
                     param="echo")
    return None


# ---------------------------------------------------------------------- logprobs


def _finite(x: float) -> float:
    # JSON has no -Infinity: a token the model rules out entirely gets the most negative finite float, as vLLM does.
    return x if math.isfinite(x) else -9999.0


def completion_logprobs(entries: Sequence[Any], offsets: Sequence[int], token_text: Callable[[int], str]) -> dict:
    """Legacy completions ``logprobs`` for the entries (``TokenLogprob``) of one response or chunk."""
    return {
        "tokens": [token_text(e.token_id) for e in entries],
        "token_logprobs": [_finite(e.logprob) for e in entries],
        "top_logprobs": [_first_per_text(e.top, token_text) for e in entries],
        "text_offset": list(offsets),
    }


def _first_per_text(top: Sequence[tuple[int, float]], token_text: Callable[[int], str]) -> dict[str, float]:
    # The legacy shape keys by text: two ids with one text (partial UTF-8 bytes all read "\ufffd") keep
    # the more likely one, so the top entry is never overwritten by a less likely namesake.
    out: dict[str, float] = {}
    for token_id, logprob in top:
        out.setdefault(token_text(token_id), _finite(logprob))
    return out


def chat_logprobs(entries: Sequence[Any], token_text: Callable[[int], str]) -> dict:
    """Chat ``logprobs`` (``{"content": [...]}``) for the entries of one response or chunk."""

    def item(token_id: int, logprob: float) -> dict:
        text = token_text(token_id)
        return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode("utf-8"))}

    return {"content": [{**item(e.token_id, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]}
                        for e in entries]}
