"""TEST DOUBLE of `tensorrt_llm.llmapi` (see the package docstring)."""

from __future__ import annotations

import json
from importlib import resources

from ._version import __version__


def family() -> str:
    major, minor = (int(p) for p in __version__.split(".")[:2])
    return f"{major}.{min(minor, 4)}" if major == 1 else "1.4"


def _names() -> dict:
    path = resources.files("specconvert") / "data" / "trtllm" / "options" / f"{family()}.json"
    return json.loads(path.read_text())


def _reject_unknown(kind: str, given: dict, allowed: list) -> None:
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise ValueError(f"fake TensorRT-LLM {__version__}: {kind} got unknown fields {unknown}")


class KvCacheConfig:
    def __init__(self, **kwargs):
        _reject_unknown("KvCacheConfig", kwargs, _names()["kv_cache_config"])
        self.kwargs = kwargs


class CudaGraphConfig:
    def __init__(self, **kwargs):
        _reject_unknown("CudaGraphConfig", kwargs, _names()["cuda_graph_config"])
        self.kwargs = kwargs


class _Decoding:
    decoding_type = ""

    def __init__(self, **kwargs):
        allowed = _names()["speculative_config"].get(self.decoding_type)
        if allowed is None:
            raise ValueError(f"fake TensorRT-LLM {__version__}: no {type(self).__name__} for decoding_type {self.decoding_type}")
        if "decoding_type" in kwargs:
            raise ValueError("decoding_type is implied by the class")
        _reject_unknown(type(self).__name__, kwargs, allowed)
        self.kwargs = kwargs


class EagleDecodingConfig(_Decoding):
    decoding_type = "Eagle"


class Eagle3DecodingConfig(_Decoding):
    decoding_type = "Eagle3"


def _check_top_level(kwargs: dict) -> None:
    _reject_unknown("LLM", kwargs, _names()["top_level"])
    spec = kwargs.get("speculative_config")
    if spec is not None and not isinstance(spec, _Decoding):
        raise ValueError("speculative_config must be a decoding config object")
    if family() == "1.2" and isinstance(spec, Eagle3DecodingConfig):
        raise ValueError("the 1.2 spelling uses EagleDecodingConfig")
    for key, cls in (("kv_cache_config", KvCacheConfig), ("cuda_graph_config", CudaGraphConfig)):
        if kwargs.get(key) is not None and not isinstance(kwargs[key], cls):
            raise ValueError(f"{key} must be a {cls.__name__}")
