"""`specconvert tune` with `runtime.backend: trtllm` (issue 34 item 6): exit 3 with the install route where
tensorrt_llm does not import, before anything is measured or written; where it does (the `tensorrt_llm` TEST DOUBLE,
tests/build/fake_trtllm, importable inside these tests only), one trtllm-serve per draft length (the TEST DOUBLE
tests/serving/fake_trtllm_serve.py, behaving as its release line serves), each run's acceptance read from the sources
that line really serves and named in the report, and build writing the schedule from that measurement.

No model runs: convert/ is written by hand (tune on trtllm loads nothing itself)."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from tests.serving.conftest import fake_trtllm_serve  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parent.parent
AUX = [1, 3, 4]


@pytest.fixture
def project(tmp_path):
    target, draft = tmp_path / "models" / "target", tmp_path / "models" / "draft"
    target.mkdir(parents=True)
    draft.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 8}))
    (target / "model.safetensors").write_bytes(b"\0" * 64)
    (draft / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 64,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": AUX, "use_aux_hidden_state": True}}))
    (draft / "model.safetensors").write_bytes(b"\1" * 32)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": t}]})
                                 for t in ("Name three colours.", "Hi!", "Count to five.")) + "\n")
    recipe = {
        "schema_version": 1, "name": "tiny-tune", "workdir": "work",
        "target": {"model": str(target), "dtype": "bfloat16"}, "draft": {"model": str(draft)},
        "build": {"max_draft_len": 2, "max_batch_size": 16},
        "runtime": {"backend": "trtllm"},
        "tune": {"prompts": str(prompts), "num_prompts": 3, "max_tokens": 12, "plots": False, "concurrency": [1, 4],
                 "startup_timeout_s": 60, "run_timeout_s": 60},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    convert = tmp_path / "work" / "convert"
    convert.mkdir(parents=True)
    (convert / "manifest.json").write_text(json.dumps({
        "manifest_version": 1, "stage": "convert", "fingerprint": "test",
        "artifacts": {"target_dir": str(target), "draft_dir": str(draft)},
        "decisions": {"aux_layer_ids": AUX, "draft_vocab_size": 64},
        "target": {"num_hidden_layers": 8, "hidden_size": 64, "vocab_size": 128, "max_position_embeddings": 8192,
                   "dtype": "bfloat16", "architecture": "LlamaForCausalLM"},
        "draft": {"max_position_embeddings": 8192, "dtype": "bfloat16"},
        "quantization": {"format": "none", "kv_cache_quant_algo": None}}, indent=2))
    return tmp_path, path


def _drop_trtllm_modules() -> None:
    for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        del sys.modules[name]


@pytest.fixture
def fake_tensorrt_llm(tmp_path_factory, monkeypatch):
    """The `tensorrt_llm` TEST DOUBLE (tests/build/fake_trtllm) at a chosen version, importable in this test only."""

    def install(version: str):
        root = tmp_path_factory.mktemp("fake_tensorrt_llm")
        shutil.copytree(ROOT / "build" / "fake_trtllm" / "tensorrt_llm", root / "tensorrt_llm")
        (root / "tensorrt_llm" / "_version.py").write_text(f'__version__ = "{version}"\nFAIL_LOAD = False\n')
        dist = root / f"tensorrt_llm-{version}.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: {version}\n")
        monkeypatch.syspath_prepend(str(root))
        importlib.invalidate_caches()
        _drop_trtllm_modules()
        assert importlib.import_module("tensorrt_llm").FAKE, "the real tensorrt_llm must never be replaced silently"

    yield install
    _drop_trtllm_modules()
    importlib.invalidate_caches()


def _tune(cli, path, *extra):
    return cli("tune", path, *extra)


def test_without_tensorrt_llm_tune_exits_3_with_the_install_route_and_writes_nothing(project, cli, fake_trtllm_serve,  # noqa: F811
                                                                                     monkeypatch):
    root, path = project
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)  # not importable, whatever this machine has
    result = _tune(cli, path)
    assert result.code == 3, result.stderr
    line = next(text for text in result.stderr.splitlines() if text.startswith("error:"))
    assert "tensorrt_llm does not import" in line
    assert "nvcr.io/nvidia/tensorrt-llm/release" in result.stderr and "docs/build.md" in result.stderr
    assert not (root / "work" / "tune").exists() and not list((root / "work").glob(".tune*"))
    assert not fake_trtllm_serve.exists()  # no server was started


@pytest.mark.parametrize("version, line, iter_stats, source", [
    ("1.3.0rc27", "1.3", "1", "measured: trtllm iteration stats"),
    ("1.4.0rc4", "1.4", "1", "measured: trtllm iteration stats"),
    # no specDecodingStats and no /perf_metrics route: 1.4's next source is its Prometheus counters
    ("1.4.0rc4", "1.4", "0", "measured: trtllm prometheus counters"),
], ids=["1.3", "1.4", "1.4-prometheus"])
def test_one_trtllm_serve_per_draft_length_and_build_writes_the_schedule(project, cli, fake_trtllm_serve,  # noqa: F811
                                                                         fake_tensorrt_llm, monkeypatch,
                                                                         version, line, iter_stats, source):
    root, path = project
    fake_tensorrt_llm(version)
    monkeypatch.setenv("FAKE_TRTLLM_LINE", line)
    monkeypatch.setenv("FAKE_TRTLLM_ITER_STATS", iter_stats)
    monkeypatch.setenv("FAKE_TRTLLM_STEP_S", "0.01")  # a step costs time, so fewer steps (drafting) pay
    result = _tune(cli, path, "--json")
    assert result.code == 0, result.stderr[-3000:]
    tune = root / "work" / "tune"
    report = json.loads((tune / "report.json").read_text())
    assert report["runtime"] == "trtllm" and version in report["runtime_note"]

    # one server per candidate, started one after another with the bundle's serve line and its own options
    started = [json.loads(text)["argv"] for text in fake_trtllm_serve.read_text().splitlines()]
    assert len(started) == 3
    for k, argv in enumerate(started):
        assert argv[0] == str(root / "models" / "target")
        assert argv[argv.index("--backend") + 1] == "pytorch" and argv[argv.index("--tp_size") + 1] == "1"
        written = Path(argv[argv.index("--extra_llm_api_options") + 1])  # in tune/'s staging folder then
        assert written.name == f"trtllm-k{k}.yaml" and report["servers"][k]["options"] == str(tune / "trtllm-options" / written.name)
        options = yaml.safe_load((tune / "trtllm-options" / written.name).read_text())
        spec = options.get("speculative_config")
        if k == 0:
            assert spec is None
        else:
            assert spec["max_draft_len"] == k and spec["decoding_type"] == "Eagle3"
            assert spec["eagle3_layers_to_capture"] == AUX and "draft_len_schedule" not in spec
        assert options["enable_iter_perf_stats"] is True
        assert options["iter_stats_max_iterations"] >= 8 * 13  # 8 requests x (prefill + 12 tokens) fit the buffer
    assert [s["label"] for s in report["servers"]] == ["k0", "k1", "k2"]

    # every run measured at every level; acceptance from the release line's own source, named per run
    cells = {(r["draft_len"], r["concurrency"]) for r in report["table"]}
    assert cells == {(k, b) for k in (0, 1, 2) for b in (1, 4)}
    assert set(report["acceptance_sources"]) == {f"{k}@{b}" for k in (1, 2) for b in (1, 4)}
    assert all(label.startswith(source) for label in report["acceptance_sources"].values())
    by_cell = {(m["draft_len"], m["concurrency"]): m for m in report["measurements"]}
    # the double accepts min(2 | 1 alternating, k) per step: 12 tokens = prefill + 6 steps of a chain of 1
    assert by_cell[(1, 1)]["acceptance_length"] == round(11 / 6, 4)
    assert all(m["identical_to_plain"] for (k, b), m in by_cell.items() if b == 1)
    assert report["lossless"]["compared"] is True and report["lossless"]["compared_draft_lengths"] == [1, 2]
    # trtllm-serve serves no per-position acceptance: none reported, nothing predicted from it
    assert report["per_position_acceptance"] == []
    assert all(r["predicted_tokens_per_second"] is None for r in report["table"])
    assert "Acceptance source per draft length" in (tune / "report.md").read_text()

    # build writes TensorRT-LLM's schedule from this measurement (backends/trtllm/schedule.py via tuning.forms)
    assert cli("build", path, "--no-load").code == 0
    manifest = json.loads((root / "work" / "engine" / "manifest.json").read_text())
    form = manifest["decisions"]["tuned"]["trtllm"]
    from specconvert.tuning import forms

    measured = forms.Measurement.from_dict(json.loads((tune / "manifest.json").read_text())["measured"])
    expected = forms.engine_forms(forms.decide(measured, 0.03), version, 16, False)["trtllm"]
    assert form == json.loads(json.dumps(expected))  # the manifest is JSON: integer keys read back as text
    options = yaml.safe_load((root / "work" / "engine" / "trtllm" / "llm_api_options.yaml").read_text())
    spec = options.get("speculative_config")
    # which branch depends on measured speed (drafting 2 should win by about 2x here); either way the bundle holds
    # exactly the form tune's measurement gives
    if form["speculate"]:
        assert spec["max_draft_len"] == form["max_draft_len"]
        schedule = form.get("draft_len_schedule")
        assert spec.get("draft_len_schedule") == ({int(b): k for b, k in schedule.items()} if schedule else None)
    else:
        assert spec is None


def test_a_release_whose_acceptance_is_unobservable_reports_the_stream_estimate(project, cli, fake_trtllm_serve,  # noqa: F811
                                                                                 fake_tensorrt_llm, monkeypatch):
    """A 1.2 build before PR #9855 serves no specDecodingStats, and no 1.2 serves a speculative_decoding block at
    /perf_metrics for EAGLE-3: the only source left is the stream-chunk estimate, and the report says so."""
    root, path = project
    fake_tensorrt_llm("1.2.1")
    monkeypatch.setenv("FAKE_TRTLLM_ITER_STATS", "0")
    result = _tune(cli, path, "--json")
    assert result.code == 0, result.stderr[-3000:]
    report = json.loads((root / "work" / "tune" / "report.json").read_text())
    started = [json.loads(text)["argv"] for text in fake_trtllm_serve.read_text().splitlines()]
    written = Path(started[1][started[1].index("--extra_llm_api_options") + 1]).name
    spec = yaml.safe_load((root / "work" / "tune" / "trtllm-options" / written).read_text())["speculative_config"]
    assert spec["decoding_type"] == "Eagle" and spec["max_draft_len"] == 1  # the 1.2 spelling
    labels = report["acceptance_sources"]
    assert labels and all(label.startswith("estimated: stream chunks") for label in labels.values())
    # the estimate is what the chunks say (the double streams one chunk per step): tau 11/6 for a chain of 1
    by_cell = {(m["draft_len"], m["concurrency"]): m for m in report["measurements"]}
    assert by_cell[(1, 1)]["acceptance_length"] == round(11 / 6, 4)
    assert by_cell[(1, 1)]["acceptance_source"].startswith("estimated: stream chunks")
    assert report["per_position_acceptance"] == []
    md = (root / "work" / "tune" / "report.md").read_text()
    assert "estimated: stream chunks" in md


def test_a_server_that_does_not_start_is_exit_4_naming_its_log(project, cli, fake_trtllm_serve,  # noqa: F811
                                                               fake_tensorrt_llm, monkeypatch):
    root, path = project
    fake_tensorrt_llm("1.3.0rc27")
    monkeypatch.setenv("FAKE_TRTLLM_MODE", "exit_on_start")
    result = _tune(cli, path)
    assert result.code == 4, result.stderr[-3000:]
    assert "server-k0.log" in result.stderr and "simulated failure while loading" in result.stderr
    assert not (root / "work" / "tune").exists()
