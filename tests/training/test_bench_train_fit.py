"""benchmarks/bench_train.py's data trend: tau against log2(trained tokens), and where it reaches a goal."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_train.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_train", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_fit_recovers_a_line_in_log2_tokens_and_says_where_it_reaches_a_goal(bench):
    points = [(1000, 1.5), (2000, 1.6), (8000, 1.8)]  # +0.1 per doubling exactly
    a, b = bench.fit_log2(points)
    assert b == pytest.approx(0.1)
    assert a + b * 12 == pytest.approx(1.7 + 0.1 * (12 - math.log2(4000)))  # 1.7 at 4000 tokens, on the line
    assert bench.tokens_for((a, b), 2.0) == pytest.approx(32000)  # two doublings past 8000


def test_no_line_without_two_data_sizes_and_no_goal_on_a_line_that_does_not_rise(bench):
    assert bench.fit_log2([(1000, 1.5), (1000, 1.6)]) is None
    assert bench.tokens_for((1.5, 0.0), 2.0) is None
    assert bench.tokens_for((1.5, -0.1), 2.0) is None


def test_a_goal_must_name_a_shape_and_a_number(bench):
    assert bench.parse_goals(["chain-3=2.0", "tree-8x5-32=2.6"]) == {"chain-3": 2.0, "tree-8x5-32": 2.6}
    for bad in ["chain-3", "chain-3=two", "=2.0"]:
        with pytest.raises(SystemExit) as err:
            bench.parse_goals([bad])
        assert "expected SHAPE=TAU" in str(err.value)
