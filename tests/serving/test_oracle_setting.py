"""The oracle decodes what the engine decodes, where it fits (issue 20 items 2 and 3), through serve-test on the
vLLM TEST DOUBLE (tests/serving/fake_vllm.py) and the real reference decoder on the tiny bundle."""

from __future__ import annotations

import json

import pytest

from .test_serve_test_reference import endpoint, engine  # noqa: F401 - fixtures (a served tiny bundle)

LLAMA_8B = {"hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 14336, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16"}


def serve_test_on_vllm(project, cli, fake_vllm, *extra):
    exe, _ = fake_vllm
    return cli("serve-test", project.recipe_path, "--set", "runtime.backend=vllm", "--set", f"runtime.vllm_python={exe}",
               "--set", "runtime.vllm_threads=1", "--set", "serve_test.stream=false", *extra, "--json")


def edit_settings(project, **changes):
    """Change this test's copy of the bundle's reference/settings.json (the manifest names the shared one)."""
    engine = project.root / "work" / "engine"
    manifest = json.loads((engine / "manifest.json").read_text())
    settings = json.loads(open(manifest["artifacts"]["reference_settings"]).read())
    path = engine / "reference" / "settings.json"
    path.write_text(json.dumps({**settings, **changes}))
    manifest["artifacts"]["reference_settings"] = str(path)
    (engine / "manifest.json").write_text(json.dumps(manifest))


def test_a_tree_bundle_is_checked_as_the_chain_vllm_runs(project, cli, fake_vllm):
    """build.tree makes the reference server decode a tree; vLLM has chains only and drafts max_draft_len (3)."""
    edit_settings(project, tree={"top_k": 2, "depth": 4, "total_tokens": 8})
    oracle = serve_test_on_vllm(project, cli, fake_vllm).json()["oracle"]
    assert oracle["decoding"]["draft_len"] == 3 and oracle["decoding"]["tree"] is None
    assert len(oracle["reference"]["per_position_acceptance"]) == 3
    assert oracle["status"] in ("agrees", "disagrees")  # compared like with like


def test_a_tuned_bundle_is_checked_at_the_draft_length_vllm_runs_at_batch_1(project, cli, fake_vllm):
    """tune's vLLM schedule drafts 2 at batch 1 and 3 above: the oracle decodes 2, not build.max_draft_len."""
    manifest = project.root / "work" / "engine" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["decisions"]["tuned"] = {"vllm": {"speculate": True, "num_speculative_tokens": 3,
                                           "num_speculative_tokens_per_batch_size": [[1, 1, 2], [2, 8, 3]], "notes": []}}
    manifest.write_text(json.dumps(data))
    oracle = serve_test_on_vllm(project, cli, fake_vllm).json()["oracle"]
    assert oracle["decoding"]["draft_len"] == 2
    assert len(oracle["reference"]["per_position_acceptance"]) == 2
    # vLLM counts per position up to num_speculative_tokens (3); the third drafted nothing at batch 1
    assert oracle["engine"]["per_position_acceptance"][2] == 0.0
    assert "drafted nothing at this batch size" in oracle["message"] and len(oracle["per_position_delta"]) == 2


def test_an_8b_target_that_does_not_fit_skips_the_oracle_with_the_reason_and_loads_nothing(
        project, cli, fake_vllm, monkeypatch, tmp_path):
    from specconvert.backends.vllm import memory
    from specconvert.serving import engine as serving_engine

    big = tmp_path / "llama-8b"
    big.mkdir()
    (big / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **LLAMA_8B}))
    edit_settings(project, target_dir=str(big))
    loads = []
    monkeypatch.setattr(serving_engine, "load_engine", lambda *a, **k: loads.append(a) or pytest.fail("loaded"))
    monkeypatch.setattr(memory, "available_gib", lambda *a, **k: 16.0)  # a 16 GiB CI runner
    result = serve_test_on_vllm(project, cli, fake_vllm)  # runtime.vllm_dtype: float32 (the default)
    report = result.json()
    oracle = report["oracle"]
    assert loads == []
    assert oracle["status"] == "skipped" and oracle["passed"] is None
    assert oracle["footprint"]["target_parameters"] == pytest.approx(8.03e9, rel=0.01)
    assert oracle["footprint"]["need_gib"] > 30 and oracle["enable"] == "serve_test.oracle.device"
    assert "8.03 B target parameters in float32" in oracle["reason"] and "serve_test.oracle.device: cuda" in oracle["reason"]
    check = next(c for c in report["checks"] if c["name"].startswith("oracle"))
    assert check["passed"] is None and check.get("skipped") and "nothing was loaded" in check["message"]
    assert result.code == 0, result.stderr[-2000:]


def test_the_token_budget_limits_the_prompts_and_the_engine_side_alike(project, cli, fake_vllm):
    """oracle.max_tokens 15 with 10 tokens per prompt: one whole prompt, compared with that prompt's counters."""
    oracle = serve_test_on_vllm(project, cli, fake_vllm, "--set", "serve_test.oracle.max_tokens=15").json()["oracle"]
    assert oracle["prompts_used"] == ["chat-a"] and [r["id"] for r in oracle["prompts"]] == ["chat-a"]
    assert oracle["engine"]["requests"] == 1 and oracle["footprint"]["tokens"] == 10


def test_the_oracle_turned_on_without_an_engine_to_check_fails_with_the_reason(project, cli, endpoint):
    """`oracle.enabled: on` with --url: no bundle to decode with. It crashed on the missing counters before, then
    passed as a skip; asked for, it must run or fail (issue 34 item 7)."""
    result = cli("serve-test", project.recipe_path, "--url", endpoint, "--set", "serve_test.oracle.enabled=on", "--json")
    oracle = result.json()["oracle"]
    assert oracle["status"] == "skipped" and "--url" in oracle["reason"] and oracle["passed"] is False
    assert result.code == 1, result.stderr[-2000:]


@pytest.mark.parametrize("vllm_dtype, config_dtype, expected", [
    ("float32", "bfloat16", "float32"),  # the recipe's choice is what vLLM served
    ("auto", "bfloat16", "bfloat16"),
    ("auto", "float32", "bfloat16"),  # vLLM 0.32 downcasts float32 models under auto
    ("auto", None, "bfloat16"),
])
def test_the_oracle_computes_in_the_dtype_vllm_served(vllm_dtype, config_dtype, expected):
    from types import SimpleNamespace

    from specconvert.stages.serve_test import _engine_dtype

    recipe = SimpleNamespace(runtime=SimpleNamespace(vllm_dtype=vllm_dtype))
    assert _engine_dtype(recipe, {"torch_dtype": config_dtype} if config_dtype else {}) == expected
