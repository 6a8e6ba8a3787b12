"""The one Prometheus text-format reader (exposition format 0.0.4): samples, and sums over label sets.

Engines' acceptance counters are read from it: vLLM's ``vllm:spec_decode_*_total``
(``backends.vllm.counters``) and TensorRT-LLM's ``trtllm_spec_decode_*_total``
(``backends.trtllm.acceptance``). It imports nothing from specconvert, so every layer may use it.
"""

from __future__ import annotations

import re
from typing import Iterable, Iterator, NamedTuple

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float


def samples(text: str | None, names: Iterable[str] | None = None) -> Iterator[Sample]:
    """Every sample line of ``text`` (``names``: only these metrics); comments and unreadable lines skipped."""
    wanted = set(names) if names is not None else None
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match or (wanted is not None and match["name"] not in wanted):
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        yield Sample(match["name"], dict(_LABEL.findall(match["labels"] or "")), value)


def totals(text: str | None, names: Iterable[str] | None = None) -> dict[str, float]:
    """Metric name -> value summed over its label sets (ranks, engines, model names)."""
    out: dict[str, float] = {}
    for sample in samples(text, names):
        out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out
