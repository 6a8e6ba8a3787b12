"""The quantization gate can fail: a quantized run that is not lossless, a comparison with no shape left, and a
drop judged on a paired bootstrap interval over prompts (noise alone does not flip it). No model runs here: the two
evaluations are written by hand in the shape `reference.evaluate.evaluate` returns."""

from __future__ import annotations

from pathlib import Path

import pytest

from specconvert.errors import CheckFailed
from specconvert.recipe import validate_recipe
from specconvert.stages import quant_check


def _recipe(gate: dict | None):
    quantize = {"format": "fp8", **({"max_acceptance_drop": gate} if gate else {})}
    return validate_recipe({"name": "tiny", "target": {"model": "t"}, "draft": {"model": "d"}, "quantize": quantize})


def _shape(per_prompt: list[list[int]], identical: bool = True) -> dict:
    """One evaluated shape: tau pooled over the prompts' [steps, accepted] as the evaluation pools them."""
    steps, accepted = sum(p[0] for p in per_prompt), sum(p[1] for p in per_prompt)
    return {"acceptance_length": round(1 + accepted / steps, 4), "per_position_acceptance": [0.5],
            "per_prompt": per_prompt, "identical_to_plain": identical}


def _measure(monkeypatch, recipe, unquantized_shapes: dict, quantized_shapes: dict) -> dict:
    monkeypatch.setattr(quant_check, "_evaluate", lambda *a, **k: {"samples": 16, "shapes": quantized_shapes})
    return quant_check.measure(recipe, Path("t"), Path("d"), [1, 2, 3], None, "cpu", "float32",
                               {"samples": 16, "shapes": unquantized_shapes}, False, {})


def test_a_quantized_run_that_is_not_lossless_fails_the_gate(monkeypatch):
    same = [[4, 4]] * 4
    report = _measure(monkeypatch, _recipe({"tau": 0.5}), {"chain-3": _shape(same)},
                      {"chain-3": _shape(same, identical=False)})
    assert report["drop"]["chain-3"]["tau_drop"] == 0.0  # no drop at all: only losslessness can fail it
    assert report["gate"]["passed"] is False
    assert "differs from the target's own greedy output" in report["gate"]["failures"][0]
    with pytest.raises(CheckFailed) as caught:
        quant_check.enforce(report, "fp8")
    assert caught.value.exit_code == 1


def test_an_empty_comparison_fails_the_gate(monkeypatch):
    report = _measure(monkeypatch, _recipe({"tau": 0.5}), {"chain-3": _shape([[4, 4]] * 2)},
                      {"tree-8x5-32": _shape([[4, 4]] * 2)})
    assert report["drop"] == {}
    assert report["gate"]["passed"] is False and "no draft shape was compared" in report["gate"]["failures"][0]


def test_noise_alone_does_not_fail_the_gate_and_the_interval_is_reported(monkeypatch):
    """16 prompts whose quantized tau scatters around the unquantized one: the point drop (0.56) is beyond the
    limit (0.5) but its 95% interval reaches below it, so the gate passes, saying inconclusive."""
    unq = [[10, 10]] * 16
    quantized = [[10, 0], [10, 20], [10, 2], [10, 18], [10, 4], [10, 16], [10, 3], [10, 1]] + [[10, 1]] * 6 + [[10, 0]] * 2
    report = _measure(monkeypatch, _recipe({"tau": 0.5}), {"chain-3": _shape(unq)}, {"chain-3": _shape(quantized)})
    drop = report["drop"]["chain-3"]
    assert drop["tau_drop"] > 0.5
    low, high = drop["interval"]["tau_drop"]
    assert low < 0.5 < high and low <= drop["tau_drop"] <= high
    assert drop["interval"]["prompts"] == 16 and drop["interval"]["confidence"] == 0.95
    assert report["gate"]["passed"] is True and "inconclusive" in report["gate"]["inconclusive"][0]
    # seeded: the same figures give the same interval
    again = _measure(monkeypatch, _recipe({"tau": 0.5}), {"chain-3": _shape(unq)}, {"chain-3": _shape(quantized)})
    assert again["drop"]["chain-3"]["interval"] == drop["interval"]


def test_a_drop_beyond_the_whole_interval_fails_naming_the_interval(monkeypatch):
    unq = [[10, 10 + (i % 3)] for i in range(16)]
    quantized = [[10, i % 2] for i in range(16)]
    report = _measure(monkeypatch, _recipe({"tau": 0.5, "relative": 0.2}), {"chain-3": _shape(unq)},
                      {"chain-3": _shape(quantized)})
    assert report["drop"]["chain-3"]["interval"]["tau_drop"][0] > 0.5
    assert report["gate"]["passed"] is False and len(report["gate"]["failures"]) == 2
    assert "> quantize.max_acceptance_drop.tau 0.5 (95% interval" in report["gate"]["failures"][0]


def test_without_per_prompt_figures_the_point_estimate_decides():
    from specconvert.recipe import AcceptanceDropSpec

    figures = {"chain-3": {"tau_unquantized": 2.0, "tau_quantized": 1.0, "tau_drop": 1.0, "relative_drop": 0.5,
                           "interval": None}}
    assert quant_check.gate(figures, AcceptanceDropSpec(tau=0.5))["passed"] is False
