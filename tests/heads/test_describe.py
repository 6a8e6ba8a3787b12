"""`inspect` summaries of heads and targets, and the late-import rule."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specconvert.errors import InputError
from specconvert.heads import describe_head, describe_target
from tests.helpers.heads import target_config, write_head, write_target_config

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("layout,expected_layout,aux,files", [
    ("eagle", "eagle", None, ["model.safetensors"]),
    ("modelopt", "modelopt", [1, 3, 4], ["model.safetensors"]),
    ("speculators", "speculators", [1, 3, 4], ["model.safetensors"]),
    ("sharded", "modelopt", [1, 3, 4], ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]),
])
def test_describe_head(tmp_path, layout, expected_layout, aux, files):
    d = describe_head(write_head(tmp_path / "h", layout))
    assert d["layout"] == expected_layout and d["aux_layer_ids"] == aux
    assert (d["hidden_size"], d["vocab_size"], d["draft_vocab_size"], d["n_aux"], d["dtype"]) == (64, 256, 128, 3, "float32")
    assert [f["name"] for f in d["files"]] == files and all(f["bytes"] > 0 for f in d["files"])
    assert d["has_t2d"] == (layout in ("eagle", "speculators"))
    assert d["num_parameters"] > 0
    json.dumps(d)  # inspect --json must be able to print it


def test_describe_pickle_head(tmp_path):
    d = describe_head(write_head(tmp_path / "h", "eagle_bin"), allow_pickle=True)
    assert d["files"][0]["name"] == "pytorch_model.bin" and any("pickle" in n for n in d["notes"])
    with pytest.raises(InputError, match="pickle"):
        describe_head(tmp_path / "h")


def test_describe_target_transformers5(tmp_path):
    d = describe_target(write_target_config(tmp_path / "t", rope_theta=500000.0))
    assert d["architectures"] == ["LlamaForCausalLM"] and d["num_hidden_layers"] == 8
    assert (d["hidden_size"], d["vocab_size"], d["head_dim"], d["rope_theta"]) == (64, 256, 16, 500000.0)
    assert d["quantization"] is None and d["files"] == []


def test_describe_target_quantized_and_legacy(tmp_path):
    t = write_target_config(tmp_path / "t", legacy_json=True,
                            quant={"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]})
    (t / "model.safetensors").write_bytes(b"0" * 10)
    d = describe_target(t)
    assert d["quantization"]["quant_algo"] == "FP8" and d["quantization"]["source"] == "hf_quant_config.json"
    assert d["dtype"] == "bfloat16" and d["rope_theta"] == 10000.0
    assert d["files"] == [{"name": "model.safetensors", "bytes": 10}]


def test_describe_target_quantization_config(tmp_path):
    t = write_target_config(tmp_path / "t", legacy_json=True, quantization_config={"quant_method": "awq", "bits": 4})
    assert describe_target(t)["quantization"] == {"source": "config.json quantization_config", "quant_method": "awq",
                                                  "quant_algo": None, "kv_cache_quant_algo": None}


def test_describe_target_multimodal(tmp_path):
    t = tmp_path / "vlm"
    t.mkdir()
    (t / "config.json").write_text(json.dumps({"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
                                               "text_config": target_config().to_dict()}))
    d = describe_target(t)
    assert d["hidden_size"] == 64 and d["num_hidden_layers"] == 8 and d["model_type"] == "llava"


def test_describe_target_errors(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        describe_target(tmp_path / "none")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="config.json is missing"):
        describe_target(tmp_path / "empty")


def test_heads_package_imports_no_torch():
    code = "import sys, specconvert.heads; print(sorted(m for m in ('torch', 'transformers', 'safetensors') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, check=True)
    assert out.stdout.strip() == "[]"
