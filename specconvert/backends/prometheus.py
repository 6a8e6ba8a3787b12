"""Prometheus text exposition -> samples: the one parser of every engine's counters (vLLM's ``/metrics``,
TensorRT-LLM's ``/prometheus/metrics``). Each engine's reader picks its own series from these samples."""

from __future__ import annotations

import re
from typing import Iterator

SAMPLE = re.compile(r'^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def samples(text: str | None) -> Iterator[tuple[str, dict[str, str], float]]:
    """``(metric name, labels, value)`` per sample line; comments, blank and malformed lines are skipped."""
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        if not match:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        yield match["name"], dict(LABEL.findall(match["labels"] or "")), value
