"""TEST DOUBLE of the `tensorrt_llm` package — not TensorRT-LLM.

Put on sys.path only by tests/build/conftest.py (fixture `fake_trtllm`). It mimics the
published LLM API surface build uses (``LLM``, ``SamplingParams``, the decoding config
classes in ``tensorrt_llm.llmapi``), validates every argument against the option names
specconvert keeps for the version it pretends to be (like TRT-LLM's strict pydantic
models would), records each ``LLM(...)`` call in ``CALLS`` and generates fake tokens.
"""

from __future__ import annotations

from types import SimpleNamespace

from ._version import __version__, FAIL_LOAD  # noqa: F401  (written by the fixture)
from .llmapi import _check_top_level, family

CALLS: list[dict] = []
FAKE = True


class SamplingParams:
    def __init__(self, max_tokens: int = 16, temperature: float = 1.0, **kwargs):
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.kwargs = kwargs


class LLM:
    def __init__(self, model, **kwargs):
        if FAIL_LOAD:
            raise ValueError("fake TensorRT-LLM: validation error (FAIL_LOAD set by the test)")
        _check_top_level(kwargs)
        self.model = model
        self.kwargs = kwargs
        self.shut_down = False
        CALLS.append({"model": model, "kwargs": kwargs, "version": __version__, "family": family()})

    def generate(self, prompts, sampling_params):
        outs = []
        for _ in prompts:
            ids = list(range(sampling_params.max_tokens))
            outs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, text="x" * len(ids))],
                                        avg_decoded_tokens_per_iter=2.5))
        return outs

    def shutdown(self):
        self.shut_down = True
