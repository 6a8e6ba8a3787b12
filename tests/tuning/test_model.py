"""Tuning arithmetic: predictions, choices and schedules, without a model."""

import pytest

from specconvert.draft_schedule import draft_len_at
from specconvert.tuning import model as M


def test_tokens_per_step_is_one_plus_prefix_of_acceptance():
    p = [0.35, 0.14, 0.06]
    assert M.tokens_per_step(p, 0) == 1.0
    assert M.tokens_per_step(p, 2) == pytest.approx(1.49)
    with pytest.raises(ValueError):
        M.tokens_per_step(p, 4)


def test_prediction_reproduces_the_demo_arithmetic():
    # Demo head on this CPU: chain 3 verifies at 1.5x a plain step and accepts 0.25/0.07/0.01.
    costs = {(0, 1): 0.045, (3, 1): 0.045 * 1.5}
    preds = {(p.draft_len, p.concurrency): p for p in M.predict([0.25, 0.07, 0.01], costs)}
    assert preds[(0, 1)].tokens_per_second == pytest.approx(1 / 0.045)
    assert preds[(3, 1)].tokens_per_second / preds[(0, 1)].tokens_per_second == pytest.approx(1.33 / 1.5)


def test_serialised_engine_does_not_multiply_by_concurrency():
    costs = {(0, 4): 0.1}
    batched = M.predict([], costs)[0]
    serial = M.predict([], costs, requests_per_step={4: 1})[0]
    assert batched.tokens_per_second == pytest.approx(4 * serial.tokens_per_second)


def test_interpolated_costs_are_linear_and_hit_the_ends():
    t = M.interpolate_step_costs(0.1, 0.16, 3)
    assert t[0] == 0.1 and t[3] == pytest.approx(0.16) and t[1] == pytest.approx(0.12)


@pytest.mark.parametrize("rates, expected", [
    pytest.param({(0, 1): 10.0, (1, 1): 10.2, (2, 1): 13.0}, {1: 2}, id="clear-winner"),
    pytest.param({(0, 1): 10.0, (1, 1): 10.2}, {1: 0}, id="within-margin-shorter-wins"),
    pytest.param({(0, 1): 10.0, (2, 1): 9.0, (0, 4): 40.0, (2, 4): 30.0}, {1: 0, 4: 0}, id="never-pays"),
    # 2 beats the chosen 0 by 3.1 % but the best shorter length (1, not chosen) by 0.2 %: the margin is
    # against the best shorter one (recipe.py, docs/tune.md), so 0 stays
    pytest.param({(0, 1): 100.0, (1, 1): 102.9, (2, 1): 103.1}, {1: 0}, id="margin-against-best-shorter"),
    pytest.param({(0, 1): 100.0, (1, 1): 110.0, (2, 1): 111.0, (3, 1): 115.0}, {1: 3}, id="longer-clears-every-shorter"),
])
def test_best_per_level(rates, expected):
    assert M.best_per_level(rates, margin=0.03) == expected


def test_schedule_is_monotone_and_switches_between_levels():
    segs = M.schedule({1: 3, 2: 3, 4: 1, 8: 2, 16: 0})
    # 8 asked for more than 4: clamped to 1, no island; the switch to 0 sits between 8 and 16.
    assert [(s.start, s.end, s.draft_len) for s in segs] == [(1, 2, 3), (3, 11, 1), (12, None, 0)]
    assert [draft_len_at(segs, b) for b in (1, 2, 3, 8, 11, 12, 100)] == [3, 3, 1, 1, 1, 0, 0]


def test_schedule_needs_batch_one():
    with pytest.raises(ValueError):
        M.schedule({2: 1, 4: 0})


def test_single_choice_is_one_unbounded_segment():
    assert M.schedule({1: 2, 4: 2}) == [M.Segment(1, None, 2)]


def test_a_tie_ends_only_its_own_prompts_comparison():
    """compare_to_plain: a difference diagnosed as a numerical tie is recorded and the next prompt is still compared;
    the first difference that is not a tie (or has no diagnosis) is the divergence and ends the comparison."""
    from specconvert.tuning.measure import Measured, compare_to_plain, differences

    outputs = {0: {0: [1, 2, 3], 1: [4, 5, 6], 2: [7, 8, 9]},
               1: {0: [1, 9, 9], 1: [4, 5, 6], 2: [7, 0, 0]},
               2: {0: [1, 2, 0], 1: [4, 5, 6], 2: [7, 8, 9]}}
    assert differences(outputs) == {1: [(0, 1), (2, 1)], 2: [(0, 2)]}
    runs = {(k, 1): Measured(k, 1) for k in (0, 1, 2)}
    tie = {"class": "tie", "margin": 0.01, "tie_margin": 0.05}
    compare_to_plain(runs, outputs, 1, {(1, 0): tie, (1, 2): {"class": "divergence", "margin": 2.0}, (2, 0): tie})
    one, two = runs[(1, 1)], runs[(2, 1)]
    assert one.identical_to_plain is False and one.ties == [{"prompt": 0, "position": 1, "margin": 0.01, "tie_margin": 0.05}]
    assert one.first_divergence == {"prompt": 2, "position": 1, "diagnosis": {"class": "divergence", "margin": 2.0}}
    assert two.identical_to_plain is False and two.first_divergence is None and len(two.ties) == 1
    compare_to_plain(runs, outputs, 1)  # nothing diagnosed: the first difference is the divergence
    assert runs[(1, 1)].first_divergence == {"prompt": 0, "position": 1, "diagnosis": None} and not runs[(1, 1)].ties


@pytest.mark.parametrize("mode", ["greedy", "strict"])
def test_lossless_asked_for_but_nothing_compared_fails(mode):
    """tune's lossless check cannot pass on nothing: no candidate compared with plain decoding is a failure (exit 1),
    not `compared: true`."""
    from specconvert.errors import CheckFailed
    from specconvert.recipe import validate_recipe
    from specconvert.stages.tune import lossless_verdict
    from specconvert.tuning.measure import Measured

    recipe = validate_recipe({"name": "t", "target": {"model": "t"}, "draft": {"model": "d"},
                              "serve_test": {"lossless": {"mode": mode}}})
    runs = {(0, 1): Measured(0, 1), (1, 1): Measured(1, 1, identical_to_plain=None),
            (2, 1): Measured(2, 1, identical_to_plain=None)}
    with pytest.raises(CheckFailed, match="no draft length's output could be compared"):
        lossless_verdict(recipe, runs)
    runs[(2, 1)].identical_to_plain = True
    verdict = lossless_verdict(recipe, runs)
    assert verdict["compared"] is True and verdict["compared_draft_lengths"] == [2]
