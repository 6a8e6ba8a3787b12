"""The draft head computes what Model Optimizer's EAGLE module computes, on the same weights."""

from __future__ import annotations

import copy

import pytest
import torch

from specconvert.reference import DraftHead, TreeShape
from specconvert.reference.target import TargetModel

from .conftest import AUX, DRAFT_VOCAB


def _modelopt_forward(model, hidden, embeds):
    """ModelOpt's own EAGLE module forward (no cache), returning (pre-norm h, draft logits)."""
    eagle = model.eagle_module
    eagle._maybe_init_rope(device=hidden.device)
    n = hidden.shape[1]
    mask = model._prepare_decoder_attention_mask(None, (1, n), 0, hidden.device, hidden.dtype)
    with torch.no_grad():
        post, pre, _ = eagle(hidden, embeds, attention_mask=mask, position_ids=None, past_key_values=None, use_cache=False)
        return pre, eagle.lm_head(post)


def _inputs(pair, n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    model = pair.modelopt_model
    aux = torch.randn(1, n, 3 * 64, generator=g)
    ids = torch.randint(0, 256, (1, n), generator=g)
    with torch.no_grad():
        hidden = model.eagle_module.fc(aux)
        embeds = model.get_input_embeddings()(ids)
    return aux, hidden, embeds


def test_head_loads_canonical_layout(pair):
    head = DraftHead.from_dir(pair.draft_dir)
    assert head.cfg.draft_vocab_size == DRAFT_VOCAB and head.cfg.num_aux == 3
    assert head.cfg.aux_layer_ids == AUX
    assert torch.equal(head.d2t, pair.modelopt_model.eagle_module.d2t)
    assert not torch.equal(head.d2t, torch.zeros_like(head.d2t))


def test_modelopt_layout_matches_modelopt_exactly(pair):
    head = DraftHead.from_dir(pair.draft_dir, norm_layout="modelopt-hf")
    _, hidden, embeds = _inputs(pair)
    ref_pre, ref_logits = _modelopt_forward(pair.modelopt_model, hidden, embeds)
    with torch.no_grad():
        pre = head(hidden, embeds, torch.arange(hidden.shape[1]), head.new_cache())
        logits = head.draft_logits(pre)
    torch.testing.assert_close(pre, ref_pre, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)


def test_deploy_layout_equals_modelopt_when_input_norm_is_identity(pair):
    """With input_layernorm's scale at 1 (an untrained head) the two layouts agree; with a
    trained scale they do not -- the discrepancy is real and recorded here."""
    model = copy.deepcopy(pair.modelopt_model)
    head = DraftHead.from_dir(pair.draft_dir)  # eagle3 layout (TRT-LLM / vLLM / SGLang math)
    _, hidden, embeds = _inputs(pair, seed=1)
    positions = torch.arange(hidden.shape[1])
    with torch.no_grad():
        differs = (head.draft_logits(head(hidden, embeds, positions)) - _modelopt_forward(model, hidden, embeds)[1]).abs().max()
        model.eagle_module.layers[0].input_layernorm.weight.fill_(1.0)
        head.input_layernorm.weight.fill_(1.0)
        _, ref_logits = _modelopt_forward(model, hidden, embeds)
        logits = head.draft_logits(head(hidden, embeds, positions))
    torch.testing.assert_close(logits, ref_logits, rtol=1e-3, atol=1e-3)
    assert differs > 1e-2


def test_incremental_cache_equals_full_forward(pair):
    head = DraftHead.from_dir(pair.draft_dir)
    _, hidden, embeds = _inputs(pair, n=10, seed=2)
    with torch.no_grad():
        full = head(hidden, embeds, torch.arange(10))
        cache = head.new_cache(capacity=4)  # forces growth
        parts = [head(hidden[:, :6], embeds[:, :6], torch.arange(6), cache)]
        for i in range(6, 10):
            parts.append(head(hidden[:, i : i + 1], embeds[:, i : i + 1], torch.tensor([i]), cache))
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)


def test_target_mapped_logits_use_d2t(pair):
    head = DraftHead.from_dir(pair.draft_dir)
    _, hidden, embeds = _inputs(pair, n=3)
    with torch.no_grad():
        pre = head(hidden, embeds, torch.arange(3))
        draft = head.draft_logits(pre)[0, -1]
        full = head.target_logits(pre, 256)[0, -1]
    best = int(draft.argmax())
    assert int(full.argmax()) == best + int(head.d2t[best])
    assert torch.isinf(full).sum() == 256 - DRAFT_VOCAB


@pytest.mark.parametrize("steps", [1, 4])
def test_drafts_equal_modelopt_pseudo_speculative_generate(pair, modelopt_dec, steps):
    """End to end against ModelOpt: aux capture on the target, fc, (feature, next token)
    pairing, pre-norm feedback, d2t. ModelOpt recomputes without a cache; we use ours."""
    model = pair.modelopt_model
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        prompt = torch.randint(3, 256, (1, int(torch.randint(2, 20, (1,), generator=g))), generator=g)
        with torch.no_grad():
            base_token, ref_draft = model.pseudo_speculative_generate(prompt, steps=steps)
        dec = modelopt_dec
        target: TargetModel = dec.target
        target.reset()
        out = target.forward(prompt[0], torch.arange(prompt.shape[1]), logits_to_keep=1)
        tok = int(out.logits[-1].argmax())
        assert tok == int(base_token)
        dec._eagle.reset()
        dec._eagle.commit(out.aux, torch.cat((prompt[0, 1:], torch.tensor([tok]))))
        tree = dec._eagle.draft(TreeShape.chain(steps))
        assert tree.tokens.tolist() == ref_draft[0].tolist()
