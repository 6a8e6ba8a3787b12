"""The recipe's `bench:` section: documented keys, defaults from the issue, validation messages."""

from __future__ import annotations

import pytest

from specconvert.errors import InputError
from specconvert.recipe import BenchSpec, SyntheticSpec, validate_recipe

BASE = {"name": "t", "target": {"model": "unused"}, "draft": {"init": "random"}}


def test_every_bench_key_is_described():
    for model in (BenchSpec, SyntheticSpec):
        for name, field in model.model_fields.items():
            assert field.description and len(field.description) > 10, f"{model.__name__}.{name}"


def test_issue_example_validates_with_its_defaults():
    bench = validate_recipe({**BASE, "bench": {"prompts": "builtin:chat-eval", "num_requests": 32, "concurrency": [1, 4, 16],
                                                "max_tokens": 128, "warmup_requests": 2, "compare_baseline": True,
                                                "temperature": 0.0, "seed": 0}}).bench
    assert bench.concurrency == [1, 4, 16] and bench.fail_below_speedup is None
    assert validate_recipe(BASE).bench == bench


@pytest.mark.parametrize("section, needle", [
    ({"concurrency": [1, 1]}, "twice"),
    ({"concurrency": [0]}, ">= 1"),
    ({"fail_below_speedup": 1.2, "compare_baseline": False}, "compare_baseline: true"),
    ({"synthetic": {"token_id_range": [50, 10]}}, "token_id_range"),
    ({"concurency": [1]}, "did you mean 'bench.concurrency'"),
])
def test_bad_bench_sections_name_the_key_and_fix(section, needle):
    with pytest.raises(InputError) as info:
        validate_recipe({**BASE, "bench": section})
    assert needle in info.value.message
