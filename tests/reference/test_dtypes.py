"""Same code in another dtype, and construction from a convert manifest."""

from __future__ import annotations

import torch

from specconvert.reference import DecodeSettings, ReferenceDecoder

from .conftest import AUX


def test_bfloat16_decodes_and_oracle_stays_in_step(pair):
    dec = ReferenceDecoder.from_dirs(pair.target_dir, pair.draft_dir, AUX, dtype="bfloat16")
    assert dec.target.dtype == torch.bfloat16 and dec.head.fc.weight.dtype == torch.bfloat16
    for settings in (DecodeSettings(max_draft_len=3), DecodeSettings(tree=dict(top_k=3, depth=3, total_tokens=10))):
        res = dec.generate([5, 6, 7, 8], 16, settings)
        assert len(res.token_ids) == 16 and res.steps >= 1
    oracle = ReferenceDecoder.from_dirs(pair.target_dir, None, None, dtype="bfloat16", drafter="oracle")
    res = oracle.generate([5, 6, 7, 8], 1 + 5 * 4, DecodeSettings(max_draft_len=3))
    # bf16 verify forwards may break near-ties differently from the one-token path; the oracle
    # re-syncs to what was emitted, so it still proposes the target's own choice almost always.
    assert res.acceptance_length >= 3.0


def test_from_convert_manifest_auto(pair):
    manifest = {
        "artifacts": {"target_dir": str(pair.target_dir), "draft_dir": str(pair.draft_dir)},
        "decisions": {"aux_layer_ids": AUX},
        "target": {"dtype": "auto"},
    }
    dec = ReferenceDecoder.from_convert_manifest(manifest, device="auto", dtype="auto")
    assert dec.target.dtype == torch.float32  # the checkpoint's own dtype
    assert dec.target.aux_layer_ids == AUX and dec.head is not None and dec.head.norm_layout == "eagle3"
    assert dec.eos_token_ids == (2,)
    assert dec.tokenizer is not None
