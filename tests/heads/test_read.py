"""Reading heads: every layout detected and canonicalised losslessly; every read error one clear line."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from specconvert.errors import InputError
from specconvert.heads import check_against_target, read_head, to_canonical
from tests.helpers.heads import TINY, canonical_tensors, source_name, write_head

EXPECTED_LAYOUT = {"eagle": "eagle", "eagle_bin": "eagle", "modelopt": "modelopt",
                   "speculators": "speculators", "sharded": "modelopt"}
CANONICAL_NAMES = {n for n in canonical_tensors() if n not in ("t2d", "embed_tokens.weight")}


@pytest.mark.parametrize("layout", list(EXPECTED_LAYOUT))
def test_layout_detected_and_canonical_is_lossless(tmp_path, layout, tiny_target):
    ckpt = read_head(write_head(tmp_path / layout, layout), allow_pickle=True)
    assert ckpt.layout == EXPECTED_LAYOUT[layout]
    head = to_canonical(ckpt)
    assert set(head.tensors) == CANONICAL_NAMES
    reference = canonical_tensors()
    for name, tensor in head.tensors.items():
        src = head.source_names[name]
        assert src == source_name(layout, name)
        assert torch.equal(tensor, ckpt.tensors[src]) and tensor.dtype == ckpt.tensors[src].dtype
        assert torch.equal(tensor, reference[name]), name  # renaming put each tensor in the right slot
    if layout.startswith("eagle"):
        assert head.source_names["layers.0.hidden_norm.weight"] == "midlayer.hidden_norm.weight"
        assert "t2d" in head.dropped
    assert head.unexpected == []
    a = head.arch
    assert (a.hidden_size, a.num_layers, a.num_attention_heads, a.num_key_value_heads, a.head_dim) == (64, 1, 4, 2, 16)
    assert (a.vocab_size, a.draft_vocab_size, a.n_aux, a.dtype) == (256, 128, 3, "float32")
    assert a.has_lm_head and a.has_d2t
    assert check_against_target(head, tiny_target) == []


def test_eagle_head_without_rope_theta_records_the_default(tmp_path):
    head = to_canonical(read_head(write_head(tmp_path / "h", "eagle")))
    assert head.arch.rope_theta == 10000.0
    assert any("rope_theta absent" in n for n in head.arch.notes)
    head2 = to_canonical(read_head(write_head(tmp_path / "h2", "eagle", rope_theta=500000.0)))
    assert head2.arch.rope_theta == 500000.0 and not any("rope_theta" in n for n in head2.arch.notes)


def test_speculators_reads_transformer_layer_config_and_input_convention_ids(tmp_path):
    head = to_canonical(read_head(write_head(tmp_path / "h", "speculators", aux_layer_ids=[2, 4, 8])))
    assert head.arch.aux_layer_ids == [1, 3, 7]  # vLLM captures at a layer's input: minus one
    assert "input convention" in head.arch.aux_layer_ids_source
    assert head.arch.intermediate_size == TINY["intermediate_size"]
    assert "embed_tokens.weight" in head.dropped


def test_speculators_diff_dict_falls_back_to_llama_defaults(tmp_path):
    d = write_head(tmp_path / "h", "speculators",
                   config_overrides={"transformer_layer_config": {"hidden_act": None, "rms_norm_eps": None}})
    cfg = json.loads((d / "config.json").read_text())
    cfg["transformer_layer_config"] = {k: v for k, v in cfg["transformer_layer_config"].items() if v is not None}
    (d / "config.json").write_text(json.dumps(cfg))
    a = to_canonical(read_head(d)).arch
    assert a.hidden_act == "silu" and a.rms_norm_eps == 1e-6
    assert any("rms_norm_eps absent" in n for n in a.notes)


def test_eagle_config_ids_are_output_convention(tmp_path):
    head = to_canonical(read_head(write_head(tmp_path / "h", "eagle", aux_layer_ids=[1, 3, 4])))
    assert head.arch.aux_layer_ids == [1, 3, 4]


@pytest.mark.parametrize("layout,fmt", [("eagle", "eagle"), ("modelopt", "modelopt"), ("speculators", "speculators")])
def test_explicit_format_accepted_when_it_matches(tmp_path, layout, fmt):
    assert read_head(write_head(tmp_path / "h", layout), format=fmt).layout == fmt


@pytest.mark.parametrize("layout,fmt", [("eagle", "modelopt"), ("modelopt", "eagle"), ("modelopt", "speculators"),
                                        ("speculators", "eagle")])
def test_explicit_format_mismatch_is_an_input_error(tmp_path, layout, fmt):
    with pytest.raises(InputError, match=f"does not match draft.format '{fmt}'") as exc:
        read_head(write_head(tmp_path / "h", layout), format=fmt)
    assert exc.value.exit_code == 2 and "draft.format" in exc.value.fix


def test_unknown_format_string(tmp_path):
    with pytest.raises(InputError, match="unknown head format 'medusa'"):
        read_head(write_head(tmp_path / "h", "modelopt"), format="medusa")


# ---------------------------------------------------------------- read errors


def _one_line(exc: InputError) -> str:
    line = exc.one_line()
    assert "\n" not in line and "Fix:" in line
    return line


def test_missing_folder(tmp_path):
    with pytest.raises(InputError, match="does not exist") as exc:
        read_head(tmp_path / "nope")
    _one_line(exc.value)


def test_path_is_a_file(tmp_path):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"x")
    with pytest.raises(InputError, match="is a file, not a folder"):
        read_head(f)


def test_missing_config(tmp_path):
    with pytest.raises(InputError, match="config.json is missing"):
        read_head(write_head(tmp_path / "h", "modelopt", no_config=True))


def test_config_not_json(tmp_path):
    d = write_head(tmp_path / "h", "modelopt")
    (d / "config.json").write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        read_head(d)


def test_no_weight_files(tmp_path):
    d = write_head(tmp_path / "h", "modelopt")
    (d / "model.safetensors").unlink()
    with pytest.raises(InputError, match="no weight files") as exc:
        read_head(d)
    assert "download" in exc.value.fix


@pytest.mark.parametrize("layout", ["modelopt", "sharded"])
def test_truncated_safetensors_names_the_file(tmp_path, layout):
    d = write_head(tmp_path / "h", layout, truncate=True)
    with pytest.raises(InputError, match=r"\.safetensors is truncated") as exc:
        read_head(d)
    assert "re-download" in _one_line(exc.value)


def test_file_cut_inside_header(tmp_path):
    d = write_head(tmp_path / "h", "modelopt")
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:40])
    with pytest.raises(InputError, match="model.safetensors is truncated"):
        read_head(d)


def test_corrupt_header(tmp_path):
    with pytest.raises(InputError, match="corrupt safetensors header"):
        read_head(write_head(tmp_path / "h", "modelopt", corrupt_header=True))


def test_trailing_garbage(tmp_path):
    d = write_head(tmp_path / "h", "modelopt")
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes() + b"\0" * 16)
    with pytest.raises(InputError, match="16 bytes after the last tensor"):
        read_head(d)


def test_pickle_refused_by_default(tmp_path):
    with pytest.raises(InputError, match="only pickle weights") as exc:
        read_head(write_head(tmp_path / "h", "eagle_bin"))
    assert "--allow-pickle" in exc.value.fix and "weights_only=True" in exc.value.fix


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_pickle_with_code_is_refused_even_when_allowed(tmp_path):
    d = write_head(tmp_path / "h", "eagle_bin")

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with (d / "pytorch_model.bin").open("wb") as fh:
        pickle.dump({"fc.weight": Evil()}, fh)
    with pytest.raises(InputError, match="cannot be loaded safely"):
        read_head(d, allow_pickle=True)


def test_corrupt_pickle(tmp_path):
    d = write_head(tmp_path / "h", "eagle_bin")
    (d / "pytorch_model.bin").write_bytes(b"garbage, not a zip or pickle")
    with pytest.raises(InputError, match="pytorch_model.bin cannot be loaded"):
        read_head(d, allow_pickle=True)


def test_sharded_index_names_a_missing_shard(tmp_path):
    d = write_head(tmp_path / "h", "sharded")
    (d / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(InputError, match="missing: model-00002-of-00002.safetensors"):
        read_head(d)


def test_sharded_index_invalid(tmp_path):
    d = write_head(tmp_path / "h", "sharded")
    (d / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(InputError, match="not a valid shard index"):
        read_head(d)


def test_unknown_layout_lists_tensor_names(tmp_path):
    t = canonical_tensors()
    d = write_head(tmp_path / "h", "modelopt", drop=tuple(n for n in t if n.startswith("layers.")))
    with pytest.raises(InputError, match="cannot tell the layout") as exc:
        read_head(d)
    assert "fc.weight" in exc.value.message and "norm.weight" in exc.value.message
    assert "draft.format" in exc.value.fix


def test_not_an_eagle3_head(tmp_path):
    with pytest.raises(InputError, match="no fc.weight"):
        read_head(write_head(tmp_path / "h", "modelopt", drop=("fc.weight",)))


def test_speculators_other_algorithm(tmp_path):
    d = write_head(tmp_path / "h", "speculators", config_overrides={"speculators_model_type": "eagle"})
    with pytest.raises(InputError, match="speculators 'eagle' model, not EAGLE-3"):
        read_head(d)


def test_d2t_int32_is_noted(tmp_path):
    d2t = canonical_tensors()["d2t"].to(torch.int32)
    head = to_canonical(read_head(write_head(tmp_path / "h", "modelopt", tensor_overrides={"d2t": d2t})))
    assert any("d2t stored as int32; widened to int64" in n for n in head.arch.notes)
    assert head.tensors["d2t"].dtype == torch.int64 and torch.equal(head.tensors["d2t"], d2t)


def test_trainer_pickles_are_not_taken_for_weights(tmp_path):
    d = write_head(tmp_path / "h", "eagle_bin")
    (d / "pytorch_model.bin").rename(d / "eagle3_head.pt")
    torch.save({"lr": 1.0}, d / "training_args.bin")
    torch.save({"state": {}}, d / "optimizer.pt")
    ckpt = read_head(d, allow_pickle=True)
    assert [f.name for f in ckpt.weight_files] == ["eagle3_head.pt"] and ckpt.layout == "eagle"
