"""Aux layer resolution: every convention converted to the output convention, every bad list refused."""

from __future__ import annotations

import pytest

from specconvert.errors import InputError
from specconvert.heads import default_aux_layer_ids, resolve_aux_layers


@pytest.mark.parametrize("n,expected", [(8, [1, 3, 4]), (32, [1, 15, 28]), (30, [1, 14, 26])])
def test_model_optimizer_default(n, expected):
    assert default_aux_layer_ids(n) == expected
    ids, note = resolve_aux_layers("auto", "output", None, 3, n)
    assert ids == expected and "Model Optimizer default" in note


def test_auto_prefers_the_heads_own_list():
    ids, note = resolve_aux_layers("auto", "input", [0, 2, 5], 3, 8)  # convention ignored: head ids are output already
    assert ids == [0, 2, 5] and "head's config" in note


@pytest.mark.parametrize("convention,requested,expected", [
    ("output", [1, 3, 4], [1, 3, 4]),
    ("input", [2, 4, 5], [1, 3, 4]),      # EAGLE paper / vLLM: input of layer i = output of i-1
    ("vllm", [2, 4, 8], [1, 3, 7]),       # id N = the last layer's output
    ("speculators", [2, 4, 5], [1, 3, 4]),
    ("sglang", [1, 3, 4], [1, 3, 4]),     # SGLang's config ids are output ids; it adds +1 internally
    ("output", [4, 1, 3], [4, 1, 3]),     # order kept: it is the fc's input order
])
def test_explicit_ids_per_convention(convention, requested, expected):
    ids, note = resolve_aux_layers(requested, convention, [0, 1, 2], 3, 8)
    assert ids == expected
    assert convention in note


@pytest.mark.parametrize("requested,convention,n_aux,match", [
    ([1, 3, 8], "output", 3, r"\[8\] lie outside the target's layers 0..7"),
    ([0, 3, 5], "input", 3, r"\[-1\] lie outside"),
    ([1, 1, 4], "output", 3, "name a layer twice"),
    ([1, 3], "output", 3, "2 ids, but the head's fc takes 3"),
    ([1, 3, 4, 5], "output", 3, "4 ids, but the head's fc takes 3"),
])
def test_bad_explicit_lists(requested, convention, n_aux, match):
    with pytest.raises(InputError, match=match) as exc:
        resolve_aux_layers(requested, convention, None, n_aux, 8)
    assert exc.value.exit_code == 2 and "draft.aux_layers" in exc.value.fix


def test_default_collapses_on_a_shallow_target():
    # N=4: {1, 1, 0} -> two distinct ids for a three-input fc
    with pytest.raises(InputError, match="2 ids, but the head's fc takes 3"):
        resolve_aux_layers("auto", "output", None, 3, 4)


def test_head_list_out_of_range_for_this_target():
    with pytest.raises(InputError, match=r"\[28\] lie outside"):
        resolve_aux_layers("auto", "output", [1, 15, 28], 3, 16)


@pytest.mark.parametrize("requested", ["1,3,4", [1.0, 3, 4], [True, 3, 4]])
def test_not_a_list_of_ints(requested):
    with pytest.raises(InputError, match="must be 'auto' or a list of integers"):
        resolve_aux_layers(requested, "output", None, 3, 8)


def test_unknown_convention():
    with pytest.raises(InputError, match="unknown aux layer convention"):
        resolve_aux_layers([1, 3, 4], "paper", None, 3, 8)
