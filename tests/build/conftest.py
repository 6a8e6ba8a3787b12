"""Fixtures for the build/doctor tests: a hand-written convert stage, a recipe, the CLI,
and the `tensorrt_llm` TEST DOUBLE (tests/build/fake_trtllm)."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from specconvert.cli import main as cli_main

HERE = Path(__file__).parent
NUM_LAYERS = 8
AUX_IDS = [1, 3, 4]  # output-of-layer convention


@dataclass
class Project:
    root: Path
    recipe_path: Path
    workdir: Path
    target_dir: Path
    draft_dir: Path

    @property
    def engine(self) -> Path:
        return self.workdir / "engine"

    def write_recipe(self, **sections) -> Path:
        data = {
            "schema_version": 1,
            "name": "tiny-build",
            "workdir": "work",
            "target": {"model": str(self.target_dir), "dtype": "bfloat16"},
            "draft": {"model": str(self.draft_dir)},
            "build": {"max_draft_len": 3},
            "runtime": {"backend": "trtllm"},
        }
        for key, value in sections.items():
            data[key] = {**data.get(key, {}), **value}
        self.recipe_path.write_text(yaml.safe_dump(data, sort_keys=False))
        return self.recipe_path

    def write_convert(self, **overrides) -> dict:
        manifest = {
            "manifest_version": 1,
            "stage": "convert",
            "fingerprint": "test",
            "artifacts": {"target_dir": str(self.target_dir), "draft_dir": str(self.draft_dir)},
            "decisions": {"aux_layer_ids": AUX_IDS, "draft_vocab_size": 64},
            "target": {"num_hidden_layers": NUM_LAYERS, "hidden_size": 64, "vocab_size": 128,
                       "max_position_embeddings": 8192, "dtype": "bfloat16", "architecture": "LlamaForCausalLM"},
            "draft": {"max_position_embeddings": 8192, "dtype": "bfloat16"},
            "quantization": {"format": "none", "kv_cache_quant_algo": None},
        }
        for key, value in overrides.items():
            manifest[key] = {**manifest[key], **value} if isinstance(value, dict) else value
        convert = self.workdir / "convert"
        convert.mkdir(parents=True, exist_ok=True)
        (convert / "manifest.json").write_text(json.dumps(manifest, indent=2))
        return manifest

    def manifest(self) -> dict:
        return json.loads((self.engine / "manifest.json").read_text())


@pytest.fixture
def project(tmp_path: Path) -> Project:
    target = tmp_path / "models" / "target"
    draft = tmp_path / "models" / "draft"
    target.mkdir(parents=True)
    draft.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": NUM_LAYERS}))
    (target / "model.safetensors").write_bytes(b"\0" * 64)
    (draft / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 64,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": AUX_IDS, "use_aux_hidden_state": True},
    }))
    (draft / "model.safetensors").write_bytes(b"\1" * 32)
    project = Project(tmp_path, tmp_path / "recipe.yaml", tmp_path / "work", target, draft)
    project.write_recipe()
    project.write_convert()
    return project


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    def json(self) -> dict:
        return json.loads(self.out)


@pytest.fixture
def cli(capsys):
    def run(*args: str) -> CliResult:
        capsys.readouterr()
        try:
            cli_main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def _drop_fake_modules() -> None:
    for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        del sys.modules[name]


@pytest.fixture
def fake_trtllm(tmp_path_factory, monkeypatch):
    """Install the TEST DOUBLE `tensorrt_llm` at a chosen version and pretend a GPU is present.

    Returns ``install(version, fail_load=False) -> module``.
    """
    from specconvert.backends.trtllm import loader

    def install(version: str, fail_load: bool = False):
        root = tmp_path_factory.mktemp("fake_trtllm")
        package = root / "tensorrt_llm"
        shutil.copytree(HERE / "fake_trtllm" / "tensorrt_llm", package)
        (package / "_version.py").write_text(f'__version__ = "{version}"\nFAIL_LOAD = {fail_load}\n')
        dist = root / f"tensorrt_llm-{version}.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: {version}\n")
        monkeypatch.syspath_prepend(str(root))
        importlib.invalidate_caches()
        _drop_fake_modules()
        monkeypatch.setattr(loader, "cuda_available", lambda: (True, "Fake GPU (test double)"))
        module = importlib.import_module("tensorrt_llm")
        assert module.FAKE, "the real tensorrt_llm must never be replaced silently"
        return module

    yield install
    _drop_fake_modules()
    importlib.invalidate_caches()


def normalise(text: str, project: Project) -> str:
    """Replace the per-test paths so generated files compare with golden copies."""
    return text.replace(str(project.draft_dir), "<DRAFT_DIR>").replace(str(project.target_dir), "<TARGET_DIR>")


def write_tiny_models(root: Path, *, vocab: int, hidden: int, heads: int, layers: int, inter: int,
                      aux: list[int], dtype: str = "float32", tokenizer=None, seed: int = 0) -> tuple[Path, Path]:
    """A random Llama target and an EAGLE-3 head in Model Optimizer's export layout (`layers.0.*`)."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    torch_dtype = getattr(torch, dtype)
    target_dir, draft_dir = root / "target", root / "draft"
    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=heads,
                         num_hidden_layers=layers, intermediate_size=inter, vocab_size=vocab,
                         max_position_embeddings=2048)
    config.architectures = ["LlamaForCausalLM"]
    LlamaForCausalLM(config).to(torch_dtype).save_pretrained(target_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(target_dir)

    def rand(*shape):
        return (torch.randn(*shape) * 0.02).to(torch_dtype)

    def ones(size):
        return torch.ones(size, dtype=torch_dtype)

    weights = {
        "fc.weight": rand(hidden, 3 * hidden),
        "norm.weight": ones(hidden),
        "lm_head.weight": rand(vocab, hidden),
        "layers.0.input_layernorm.weight": ones(hidden),
        "layers.0.hidden_norm.weight": ones(hidden),
        "layers.0.post_attention_layernorm.weight": ones(hidden),
        "layers.0.self_attn.q_proj.weight": rand(hidden, 2 * hidden),
        "layers.0.self_attn.k_proj.weight": rand(hidden, 2 * hidden),
        "layers.0.self_attn.v_proj.weight": rand(hidden, 2 * hidden),
        "layers.0.self_attn.o_proj.weight": rand(hidden, hidden),
        "layers.0.mlp.gate_proj.weight": rand(inter, hidden),
        "layers.0.mlp.up_proj.weight": rand(inter, hidden),
        "layers.0.mlp.down_proj.weight": rand(hidden, inter),
    }
    draft_dir.mkdir()
    save_file(weights, str(draft_dir / "model.safetensors"))
    (draft_dir / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
        "num_attention_heads": heads, "num_key_value_heads": heads, "num_hidden_layers": 1,
        "intermediate_size": inter, "vocab_size": vocab, "draft_vocab_size": vocab,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
        "torch_dtype": dtype, "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux},
    }))
    return target_dir, draft_dir


def tiny_project(tmp_path: Path, target_dir: Path, draft_dir: Path, *, layers: int, hidden: int, vocab: int,
                 aux: list[int], dtype: str, recipe: dict) -> Project:
    project = Project(tmp_path, tmp_path / "recipe.yaml", tmp_path / "work", target_dir, draft_dir)
    project.write_recipe(**recipe)
    project.write_convert(decisions={"aux_layer_ids": aux, "draft_vocab_size": vocab},
                          target={"num_hidden_layers": layers, "hidden_size": hidden, "vocab_size": vocab,
                                  "max_position_embeddings": 2048, "dtype": dtype},
                          draft={"max_position_embeddings": 2048, "dtype": dtype})
    return project
