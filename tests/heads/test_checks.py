"""Every head/target mismatch is caught, with its key, a message naming the numbers, and a fix."""

from __future__ import annotations

import pytest
import torch

from specconvert.errors import InputError
from specconvert.heads import (
    TargetInfo,
    check_against_target,
    errors_of,
    raise_for_problems,
    read_head,
    to_canonical,
)
from tests.helpers.heads import canonical_tensors, target_config, write_head

T = canonical_tensors()
_rnd = torch.Generator().manual_seed(1)


def _problems(tmp_path, layout="modelopt", target=None, **head_kw):
    head = to_canonical(read_head(write_head(tmp_path / "h", layout, **head_kw)))
    return check_against_target(head, TargetInfo.from_config(target or target_config()))


def _t2d_extra():
    t2d = T["t2d"].clone()
    t2d[int((~t2d).nonzero()[0])] = True
    return t2d


# (id, layout, head kwargs, target overrides, key, severity, text in the message)
CASES = [
    ("target_hidden", "modelopt", {}, dict(hidden_size=128, head_dim=32), "hidden_size", "error", "target has 128"),
    ("head_target_hidden", "modelopt", dict(target_hidden_size=96), {}, "hidden_size", "error", "target hidden size of 96"),
    ("fc_width", "modelopt", dict(target_hidden_size=80, config_overrides={"target_hidden_size": None}), {},
     "hidden_size", "error", "fc.weight takes 240 inputs"),
    ("draft_hidden", "modelopt", dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, target_hidden_size=64),
     {}, "hidden_size", "error", "hidden size 32 differs"),
    ("vocab", "modelopt", {}, dict(vocab_size=512), "vocab_size", "error", "vocab_size 256 differs from the target's 512"),
    ("draft_vocab_too_big", "modelopt", dict(vocab_size=512, draft_vocab_size=300), {}, "draft_vocab_size", "error",
     "exceeds the target vocabulary 256"),
    ("lm_head_rows", "modelopt", dict(config_overrides={"draft_vocab_size": 100}), {}, "lm_head", "error",
     "expected [draft_vocab_size=100"),
    ("d2t_len", "modelopt", dict(config_overrides={"draft_vocab_size": 100}), {}, "d2t.shape", "error", "expected [100]"),
    ("no_lm_head", "modelopt", dict(with_lm_head=False), {}, "lm_head", "error", "target's lm_head cannot stand in"),
    ("no_d2t", "modelopt", dict(with_d2t=False), {}, "d2t", "error", "cannot be mapped"),
    ("d2t_range", "modelopt", dict(d2t_out_of_range=True), {}, "d2t.range", "error", "draft id 127 -> 261"),
    ("d2t_injective", "modelopt", dict(d2t_duplicate=True), {}, "d2t.injective", "error", "1 draft ids"),
    ("d2t_float", "modelopt", dict(tensor_overrides={"d2t": T["d2t"].float()}), {}, "d2t.dtype", "error", "not an integer"),
    ("t2d_disagrees", "eagle", dict(t2d_mismatch=True), {}, "t2d", "error", "disagrees with d2t"),
    ("t2d_count", "eagle", dict(tensor_overrides={"t2d": _t2d_extra()}), {}, "t2d", "error", "marks 129 target ids"),
    ("t2d_length", "eagle", dict(tensor_overrides={"t2d": torch.ones(300, dtype=torch.bool)}), {}, "t2d", "error",
     "covers 300 target ids"),
    ("aux_range", "modelopt", dict(aux_layer_ids=[1, 3, 9]), {}, "aux_layer_ids", "error", "include [9]"),
    ("aux_count", "modelopt", dict(aux_layer_ids=[1, 3]), {}, "aux_layer_ids", "error", "takes 3 hidden states"),
    ("num_layers", "modelopt", dict(config_overrides={"num_hidden_layers": 2}), {}, "num_layers", "error",
     "num_hidden_layers=2 but the tensors hold layers [0]"),
    ("q_heads", "modelopt", dict(config_overrides={"num_attention_heads": 8}), {}, "attention.heads", "error",
     "8 × 16 = 128"),
    ("kv_heads", "modelopt", dict(config_overrides={"num_key_value_heads": 4}), {}, "attention.heads", "error",
     "num_key_value_heads × head_dim = 4 × 16 = 64"),
    ("layer0_input", "modelopt", dict(tensor_overrides={"layers.0.self_attn.q_proj.weight": torch.zeros(64, 64)}), {},
     "attention.input_dim", "error", "2 × hidden_size = 128"),
    ("mlp_shape", "eagle", dict(config_overrides={"intermediate_size": 256}), {}, "tensor_shape", "error",
     "midlayer.mlp.gate_proj.weight has shape [128, 64], expected [256, 64]"),
    ("rope_theta", "modelopt", {}, dict(rope_theta=500000.0), "rope_theta", "warning", "differs from the target's 500000"),
    ("rope_theta_default", "eagle", {}, dict(rope_theta=500000.0), "rope_theta", "warning", "absent, Llama default"),
    ("rope_scaling", "modelopt", dict(config_overrides={"rope_scaling": {"type": "linear", "factor": 2.0}}), {},
     "rope_scaling", "warning", "'rope_type': 'linear'"),
    ("max_positions", "modelopt", {}, dict(max_position_embeddings=131072), "max_position_embeddings", "warning",
     "2048 < the target's 131072"),
    ("mixed_dtype", "modelopt", dict(mixed_dtype=True), {}, "dtype", "error", "float16,float32"),
    ("missing", "eagle", dict(drop=("midlayer.hidden_norm.weight",)), {}, "missing_tensor", "error",
     "layers.0.hidden_norm.weight is missing"),
    ("extra", "modelopt", dict(extra={"medusa_head.weight": torch.zeros(3)}), {}, "unexpected_tensor", "error",
     "medusa_head.weight"),
    ("extra_layer_tensor", "modelopt", dict(extra={"layers.0.self_attn.rotary.inv_freq": torch.zeros(3)}), {},
     "unexpected_tensor", "error", "layers.0.self_attn.rotary.inv_freq"),
    ("embed_shape", "speculators", dict(tensor_overrides={"embed_tokens.weight": torch.zeros(256, 32)}), {},
     "embed_tokens", "error", "[256, 32]"),
    ("fc_bias", "speculators", dict(extra={"fc.bias": torch.randn(64, generator=_rnd)}), {}, "fc.bias", "error",
     "non-zero bias"),
    ("norm_before_residual", "speculators", dict(config_overrides={"norm_before_residual": True}), {},
     "norm_before_residual", "error", "before the residual"),
]


@pytest.mark.parametrize("layout,head_kw,target_kw,key,severity,text",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_mismatch_is_reported(tmp_path, layout, head_kw, target_kw, key, severity, text):
    problems = _problems(tmp_path, layout, target_config(**target_kw), **head_kw)
    hits = [p for p in problems if p.key == key and text in p.message]
    assert hits, f"no {key} problem with {text!r}; got: {[p.one_line() for p in problems]}"
    assert all(p.severity == severity and p.fix for p in hits)


def test_all_problems_reported_not_just_the_first(tmp_path):
    problems = _problems(tmp_path, "eagle", target_config(vocab_size=512, rope_theta=500000.0),
                         d2t_duplicate=True, mixed_dtype=True)
    keys = {p.key for p in problems}
    assert {"vocab_size", "t2d", "d2t.injective", "dtype", "rope_theta"} <= keys
    with pytest.raises(InputError) as exc:
        raise_for_problems(problems)
    assert exc.value.exit_code == 2
    assert len(exc.value.problems) == len(errors_of(problems)) >= 4
    assert all("Fix:" in line for line in exc.value.problems)


def test_zero_fc_bias_is_accepted_and_dropped(tmp_path, tiny_target):
    head = to_canonical(read_head(write_head(tmp_path / "h", "speculators", extra={"fc.bias": torch.zeros(64)})))
    assert "fc.bias" in head.dropped and "fc.bias" not in head.tensors
    assert check_against_target(head, tiny_target) == []


def test_full_vocab_head_may_omit_lm_head_and_d2t(tmp_path, tiny_target):
    head = to_canonical(read_head(write_head(tmp_path / "h", "modelopt", draft_vocab_size=256,
                                             with_lm_head=False, with_d2t=False)))
    assert not head.arch.has_lm_head and not head.arch.has_d2t
    assert check_against_target(head, tiny_target) == []


def test_two_layer_head(tmp_path, tiny_target):
    head = to_canonical(read_head(write_head(tmp_path / "h", "modelopt", num_layers=2)))
    assert head.arch.num_layers == 2 and "layers.1.self_attn.q_proj.weight" in head.tensors
    assert check_against_target(head, tiny_target) == []


def test_bf16_head_is_consistent(tmp_path, tiny_target):
    head = to_canonical(read_head(write_head(tmp_path / "h", "eagle", dtype="bfloat16")))
    assert head.arch.dtype == "bfloat16"
    assert check_against_target(head, tiny_target) == []


# ---------------------------------------------------------------- TargetInfo


def test_target_info_from_transformers5_config():
    info = TargetInfo.from_config(target_config(rope_theta=500000.0))
    assert (info.hidden_size, info.vocab_size, info.num_hidden_layers, info.head_dim) == (64, 256, 8, 16)
    assert info.rope_theta == 500000.0 and info.rope_scaling is None and info.num_key_value_heads == 2


def test_target_info_from_legacy_dict_with_scaling():
    cfg = target_config().to_dict()
    cfg.pop("rope_parameters", None)
    cfg.update(rope_theta=500000.0, rope_scaling={"type": "linear", "factor": 4.0})
    info = TargetInfo.from_config(cfg)
    assert info.rope_theta == 500000.0 and info.rope_scaling == {"rope_type": "linear", "factor": 4.0}


def test_target_info_rope_parameters_with_scaling():
    cfg = {"hidden_size": 64, "vocab_size": 256, "num_hidden_layers": 8, "num_attention_heads": 4,
           "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0}}
    info = TargetInfo.from_config(cfg)
    assert info.rope_theta == 500000.0 and info.rope_scaling == {"rope_type": "llama3", "factor": 8.0}
    assert info.head_dim == 16 and info.num_key_value_heads == 4


def test_target_info_text_config():
    info = TargetInfo.from_config({"model_type": "llava", "text_config": target_config().to_dict()})
    assert info.hidden_size == 64


def test_target_info_incomplete():
    with pytest.raises(InputError, match="lacks hidden_size"):
        TargetInfo.from_config({"vocab_size": 3, "num_hidden_layers": 1, "num_attention_heads": 1})


def test_specforge_style_head_layers_with_t2d_and_embed(tmp_path, tiny_target):
    # SpecForge (SGLang) saves layers.0.* names plus t2d and embed_tokens: read as modelopt names, extras checked and dropped
    ckpt = read_head(write_head(tmp_path / "h", "modelopt", with_t2d=True, with_embed=True, aux_layer_ids=[1, 3, 4]))
    head = to_canonical(ckpt)
    assert ckpt.layout == "modelopt" and set(head.dropped) == {"t2d", "embed_tokens.weight"}
    assert "t2d" not in head.tensors and "embed_tokens.weight" not in head.tensors
    assert check_against_target(head, tiny_target) == []
