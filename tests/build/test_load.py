"""Loading and warming the bundle: TensorRT-LLM through the `tensorrt_llm` TEST DOUBLE,
the reference decoder through a stand-in module, and the honest "not loaded" paths."""

from __future__ import annotations

import importlib.util
import sys
import types
from dataclasses import dataclass

import pytest

from conftest import AUX_IDS


def test_fake_trtllm_1_3_loads_with_eagle3_config(project, cli, fake_trtllm):
    trtllm = fake_trtllm("1.3.0rc27")
    result = cli("build", project.recipe_path, "--json")
    assert result.code == 0, result.err
    manifest = result.json()["manifest"]
    assert manifest["loaded"] is True and manifest["load_skipped_reason"] is None
    assert manifest["decisions"]["trtllm_version"] == "1.3.0rc27"
    assert manifest["decisions"]["trtllm_version_source"] == "installed"
    assert manifest["load"]["gpu"] == "Fake GPU (test double)"
    assert manifest["load"]["warmup"]["acceptance_length"] == 2.5
    assert manifest["load"]["warmup"]["new_tokens"] == 2 * 32
    assert manifest["versions"]["tensorrt_llm"] == "1.3.0rc27"
    assert "load_s" in manifest["timings"]
    (call,) = trtllm.CALLS
    assert call["model"] == str(project.target_dir)
    spec = call["kwargs"]["speculative_config"]
    assert type(spec).__name__ == "Eagle3DecodingConfig"
    assert spec.kwargs == {"max_draft_len": 3, "speculative_model": str(project.draft_dir),
                           "eagle3_layers_to_capture": AUX_IDS}
    assert type(call["kwargs"]["kv_cache_config"]).__name__ == "KvCacheConfig"
    assert call["kwargs"]["max_seq_len"] == 4096


def test_fake_trtllm_1_2_loads_with_eagle_config(project, cli, fake_trtllm):
    trtllm = fake_trtllm("1.2.1")
    result = cli("build", project.recipe_path, "--json", "--set", "runtime.trtllm_version=1.3")
    assert result.code == 0, result.err
    manifest = result.json()["manifest"]
    assert manifest["decisions"]["spelling_family"] == "1.2"  # the installed version wins over the pin
    assert any("1.2.1 is installed" in w for w in manifest["warnings"])
    (call,) = trtllm.CALLS
    spec = call["kwargs"]["speculative_config"]
    assert type(spec).__name__ == "EagleDecodingConfig"
    assert spec.kwargs["speculative_model_dir"] == str(project.draft_dir)
    assert spec.kwargs["eagle3_one_model"] is True


def test_fake_trtllm_rejecting_options_is_external_failure_and_writes_nothing(project, cli, fake_trtllm):
    fake_trtllm("1.3.0rc27", fail_load=True)
    result = cli("build", project.recipe_path)
    assert result.code == 4
    assert "TensorRT-LLM rejected the bundle's options" in result.err and "--no-load" in result.err
    assert sorted(p.name for p in project.workdir.iterdir()) == ["convert"]


def test_trtllm_without_gpu_is_not_loaded(project, cli, fake_trtllm, monkeypatch):
    fake_trtllm("1.3.0rc27")
    from specconvert.backends.trtllm import loader

    monkeypatch.setattr(loader, "cuda_available", lambda: (False, None))
    result = cli("build", project.recipe_path, "--json")
    assert result.code == 0
    assert result.json()["manifest"]["load_skipped_reason"] == "no CUDA GPU visible"


def test_no_load_flag_skips_loading_even_when_possible(project, cli, fake_trtllm):
    trtllm = fake_trtllm("1.3.0rc27")
    result = cli("build", project.recipe_path, "--json", "--no-load")
    assert result.json()["manifest"]["loaded"] is False and trtllm.CALLS == []


@pytest.mark.skipif(importlib.util.find_spec("specconvert.reference") is not None,
                    reason="specconvert.reference is present in this checkout")
def test_reference_backend_absent_module_recorded_not_faked(project, cli):
    project.write_recipe(runtime={"backend": "reference", "device": "cpu"})
    result = cli("build", project.recipe_path, "--json")
    assert result.code == 0, result.err
    manifest = result.json()["manifest"]
    assert manifest["loaded"] is False
    assert manifest["load_skipped_reason"].startswith("specconvert.reference not available")


@dataclass
class _FakeResult:
    token_ids: list
    acceptance_length: float
    tokens_per_second: float


def _fake_reference_module(calls: list) -> types.ModuleType:
    """A stand-in `specconvert.reference` with the agreed API (TEST DOUBLE)."""
    module = types.ModuleType("specconvert.reference")

    @dataclass
    class DecodeSettings:
        max_draft_len: int
        tree: object
        temperature: float
        speculative: bool = True

    class _Tokenizer:
        def encode(self, text):
            return [ord(c) % 100 for c in text]

    class ReferenceDecoder:
        tokenizer = _Tokenizer()

        @classmethod
        def from_convert_manifest(cls, manifest, device, dtype):
            calls.append(("load", manifest["artifacts"]["draft_dir"], device, dtype))
            return cls()

        def generate(self, prompt_ids, max_new_tokens, settings):
            calls.append(("generate", len(prompt_ids), max_new_tokens, settings))
            return _FakeResult(list(range(max_new_tokens)), 2.75, 12.5)

    module.DecodeSettings = DecodeSettings
    module.ReferenceDecoder = ReferenceDecoder
    return module


def test_reference_backend_loads_and_warms(project, cli, monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "specconvert.reference", _fake_reference_module(calls))
    project.write_recipe(runtime={"backend": "reference", "device": "cpu"}, build={"max_draft_len": 4})
    result = cli("build", project.recipe_path, "--json")
    assert result.code == 0, result.err
    manifest = result.json()["manifest"]
    assert manifest["loaded"] is True and manifest["load"]["backend"] == "reference"
    assert manifest["load"]["warmup"] == {"prompt": "The capital of France is", "new_tokens": 32,
                                          "acceptance_length": 2.75, "tokens_per_second": 12.5}
    assert calls[0] == ("load", str(project.draft_dir), "cpu", "bfloat16")
    settings = calls[1][3]
    assert (settings.max_draft_len, settings.tree, settings.temperature) == (4, None, 0.0)


def test_reference_backend_gets_the_tree_as_a_mapping(project, cli, monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "specconvert.reference", _fake_reference_module(calls))
    project.write_recipe(runtime={"backend": "reference", "device": "cpu"},
                         build={"tree": {"top_k": 4, "depth": 3, "total_tokens": 12}})
    assert cli("build", project.recipe_path).code == 0
    assert calls[1][3].tree == {"top_k": 4, "depth": 3, "total_tokens": 12}


def test_reference_module_failing_inside_is_not_swallowed(project, cli, monkeypatch):
    broken = types.ModuleType("specconvert.reference")

    def __getattr__(name):
        raise ImportError("No module named 'some_dependency'", name="some_dependency")

    broken.__getattr__ = __getattr__
    monkeypatch.setitem(sys.modules, "specconvert.reference", broken)
    project.write_recipe(runtime={"backend": "reference", "device": "cpu"})
    result = cli("build", project.recipe_path)
    assert result.code == 1 and "some_dependency" in result.err
    assert not project.engine.exists()


def test_trtllm_runtime_failure_while_warming_is_external_failure(project, cli, fake_trtllm, monkeypatch):
    trtllm = fake_trtllm("1.3.0rc27")

    def broken_generate(self, prompts, params):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(trtllm.LLM, "generate", broken_generate)
    result = cli("build", project.recipe_path)
    assert result.code == 4 and "warm-up generation failed" in result.err and "illegal memory access" in result.err
    assert not project.engine.exists()
