"""bench's arms: the tuned bundle next to fixed chain lengths and the baseline, in one interleaved run.

A tiny tuned bundle (real convert + build, tune result written as the stage seals it) is benched on the vLLM
TEST DOUBLE (tests/serving/fake_vllm.py: a chain drafting n tokens accepts min(2, n) per step) and on the
trtllm-serve double; the RAM check of `runtime.vllm_servers: auto` is tested with fake /proc and cgroup files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from specconvert.backends.vllm import memory
from specconvert.bench.workload import interleaved_schedule
from specconvert.recipe import load_recipe
from tests.serving.conftest import _cli, assert_reaped, fake_vllm  # noqa: F401  (fixture)
from tests.tuning.test_build_uses_tune import _write_tune

QUICK = ["--set", "bench.prompts=synthetic", "--set", "bench.num_requests=2", "--set", "bench.max_tokens=10",
         "--set", "bench.warmup_requests=0", "--set", "bench.plots=false"]


def test_schedule_runs_every_arm_in_turn_rotating_each_repeat():
    order = [r.name for r in interleaved_schedule([1, 4], 4, True, ["fixed-k1", "fixed-k3"])]
    assert order[:8] == ["baseline-c1-r0", "fixed-k1-c1-r0", "fixed-k3-c1-r0", "speculative-c1-r0",
                         "fixed-k1-c1-r1", "fixed-k3-c1-r1", "speculative-c1-r1", "baseline-c1-r1"]
    assert len(order) == 32 and order[16] == "baseline-c4-r0"
    # over 4 repeats every arm runs once in every position, so none always follows the same one
    for label in ("baseline", "fixed-k1", "fixed-k3", "speculative"):
        assert sorted(order[:16].index(f"{label}-c1-r{r}") - 4 * r for r in range(4)) == [0, 1, 2, 3]


@pytest.mark.parametrize("value, message", [([0], "1..16"), ([2, 2], "twice"), ("all", "fixed_draft_lens")])
def test_fixed_draft_lens_is_validated(cli, tmp_path, value, message):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "target": {"model": "m"}, "draft": {"init": "random"},
                                    "bench": {"fixed_draft_lens": value}}))
    result = cli("recipe", "validate", path)
    assert result.code == 2 and message in result.stderr


# --- the RAM check of runtime.vllm_servers: auto -------------------------------------------------


def test_auto_puts_servers_together_only_when_they_fit():
    assert memory.choose("auto", 3, 5.0, 16.0)[0] == "together"
    mode, why = memory.choose("auto", 3, 5.0, 12.0)
    assert mode == "sequential" and "15.0 GiB" in why and "12.0 GiB available" in why
    assert memory.choose("auto", 3, 5.0, None)[0] == "sequential"
    assert memory.choose("together", 3, 5.0, 1.0)[0] == "together"  # the user's word wins
    assert memory.choose("sequential", 2, 1.0, 100.0)[0] == "sequential"


def test_available_memory_is_the_tighter_of_meminfo_and_the_cgroup(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 25165824 kB\nMemAvailable: 16777216 kB\n")  # 16 GiB
    root = tmp_path / "cg"
    (root / "ci" / "job").mkdir(parents=True)
    (root / "ci" / "memory.max").write_text(str(10 * memory.GIB))
    (root / "ci" / "memory.current").write_text(str(4 * memory.GIB))
    (root / "ci" / "job" / "memory.max").write_text("max")
    (root / "ci" / "job" / "memory.current").write_text("0")
    own = tmp_path / "cgroup"
    own.write_text("0::/ci/job\n")
    assert memory.available_gib(meminfo, root, own) == pytest.approx(6.0)
    own.write_text("0::/\n")
    assert memory.available_gib(meminfo, root, own) == pytest.approx(16.0)
    assert memory.available_gib(tmp_path / "none", root, tmp_path / "none") is None


def test_weights_are_counted_through_symlinks(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "model.safetensors").write_bytes(b"\0" * 4096)
    (tmp_path / "t" / "config.json").write_text("{}")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "model.safetensors").symlink_to(tmp_path / "t" / "model.safetensors")
    assert memory.weights_gib([tmp_path / "t", tmp_path / "d", None]) == pytest.approx(8192 / memory.GIB)


# --- a tuned bundle on the vLLM double -----------------------------------------------------------


@pytest.fixture(scope="module")
def tuned_bundle(tmp_path_factory):
    from tests.helpers.heads import write_head
    from tests.tiny_models import write_tiny_target

    root = tmp_path_factory.mktemp("tuned-bench")
    write_tiny_target(root / "target")
    write_head(root / "head", "modelopt")
    recipe = {"schema_version": 1, "name": "tiny-arms", "workdir": "work",
              "target": {"model": str(root / "target"), "dtype": "float32"}, "draft": {"model": str(root / "head")},
              "build": {"max_draft_len": 3, "max_batch_size": 8},
              "runtime": {"backend": "reference", "device": "cpu"}, "bench": {"concurrency": [1, 4]}}
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    assert _cli("convert", path) == 0
    _write_tune(path, {1: 1, 4: 0})  # chain of 1 at batch 1, off from batch 3 on
    assert _cli("build", path, "--no-load") == 0
    return root, path


def _spec_config(start):
    argv = start["argv"]
    return json.loads(argv[argv.index("--speculative-config") + 1]) if "--speculative-config" in argv else None


def test_tuned_bundle_is_benched_against_the_recipes_fixed_chain_and_the_baseline(cli, tuned_bundle, fake_vllm, tmp_path,
                                                                                   monkeypatch):  # noqa: F811
    root, path = tuned_bundle
    exe, log = fake_vllm
    monkeypatch.setattr(memory, "available_gib", lambda *a, **k: 64.0)  # room for all three: auto interleaves them
    out = tmp_path / "bench"
    result = cli("bench", path, "--set", "runtime.backend=vllm", "--set", f"runtime.vllm_python={exe}",
                 "--set", "bench.repeats=2", "--out", out, *QUICK, "--set", "bench.num_requests=4")
    assert result.code == 0, result.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    # auto: the recipe's own chain (build.max_draft_len 3) joins, all three servers up at once, runs interleaved
    assert [a["label"] for a in report["arms"]] == ["baseline", "fixed-k3", "speculative"]
    assert report["arms"][-1]["tuned"] is True
    assert report["servers_together"]["together"] is True
    assert report["schedule"][:6] == ["baseline-c1-r0", "fixed-k3-c1-r0", "speculative-c1-r0",
                                      "fixed-k3-c1-r1", "speculative-c1-r1", "baseline-c1-r1"]
    configs = {s["label"]: s for s in report["servers"]}
    assert set(configs) == {"baseline", "fixed-k3", "speculative"}
    by_name = {s["argv"][s["argv"].index("--served-model-name") + 1]: _spec_config(s) for s in
               map(json.loads, log.read_text().splitlines())}
    assert by_name["tiny-arms-baseline"] is None
    assert by_name["tiny-arms-k3"]["num_speculative_tokens"] == 3
    assert "num_speculative_tokens_per_batch_size" not in by_name["tiny-arms-k3"]  # fixed: no schedule
    assert by_name["tiny-arms"]["num_speculative_tokens"] == 1
    assert by_name["tiny-arms"]["num_speculative_tokens_per_batch_size"]  # the bundle's tuned schedule
    level1 = report["levels"][0]
    # the double accepts min(2, n) drafts per step: tau 3 for the fixed chain of 3, 2 for the tuned chain of 1
    assert level1["fixed"]["fixed-k3"]["acceptance"]["acceptance_length"] == pytest.approx(3.0, abs=0.35)
    assert level1["acceptance"]["acceptance_length"] == pytest.approx(2.0, abs=0.35)
    # above batch 1 the tuned schedule rules: 4 requests in flight draft nothing (off from batch 3), while the
    # fixed chain still drafts 3 at the same batch
    level4 = report["levels"][1]
    assert level4["concurrency"] == 4
    assert level4["acceptance"]["acceptance_length"] == pytest.approx(1.0, abs=0.15)
    assert level4["fixed"]["fixed-k3"]["acceptance"]["acceptance_length"] == pytest.approx(3.0, abs=0.35)
    assert level1["fixed"]["fixed-k3"]["speculative_vs_this"]["output_tokens_per_s"]["pairs"] == 2
    vb = level1["versus_best"]
    assert vb["best_other"] in ("baseline", "fixed-k3")
    assert vb["ratio_to_best_other"] == pytest.approx(
        vb["speculative_output_tokens_per_s"] / vb["best_other_output_tokens_per_s"], rel=1e-3)
    md = (out / "report.md").read_text()
    assert "### The bundle against fixed settings" in md and "speculative (tuned)" in md and "fixed-k3" in md
    assert "the best other arm" in result.stdout
    assert_reaped([s["pid"] for s in report["servers"]])


def test_without_room_for_every_server_auto_runs_them_one_at_a_time(cli, tuned_bundle, fake_vllm, tmp_path, monkeypatch):  # noqa: F811
    root, path = tuned_bundle
    exe, log = fake_vllm
    monkeypatch.setattr(memory, "available_gib", lambda *a, **k: 3.0)
    out = tmp_path / "bench"
    result = cli("bench", path, "--set", "runtime.backend=vllm", "--set", f"runtime.vllm_python={exe}",
                 "--set", "bench.repeats=1", "--set", "bench.concurrency=[1]", "--set", "bench.fixed_draft_lens=[1,2]",
                 "--out", out, *QUICK)
    assert result.code == 0, result.stderr[-2000:]
    assert "one after the other" in result.stderr and "3.0 GiB available" in result.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["order"].startswith("sequential") and report["servers_together"]["together"] is False
    assert [s["label"] for s in report["servers"]] == ["baseline", "fixed-k1", "fixed-k2", "speculative"]
    names = [s["argv"][s["argv"].index("--served-model-name") + 1] for s in map(json.loads, log.read_text().splitlines())]
    assert names == ["tiny-arms-baseline", "tiny-arms-k1", "tiny-arms-k2", "tiny-arms"]
    assert "sequential" in (out / "report.md").read_text()


def test_fixed_arms_need_servers_bench_starts(cli, tuned_bundle, tmp_path):
    root, path = tuned_bundle
    result = cli("bench", path, "--url", "http://127.0.0.1:9", "--set", "bench.fixed_draft_lens=[2]", "--out",
                 tmp_path / "b")
    assert result.code == 2 and "fixed-length arms" in result.stderr and "--url" in result.stderr
    assert not (tmp_path / "b").exists()


def test_an_untuned_bundle_gets_no_fixed_arm_by_default(tuned_bundle):
    from specconvert.stages.bench import fixed_draft_lens

    recipe = load_recipe(tuned_bundle[1])
    assert fixed_draft_lens(recipe.bench, recipe, False, None) == []
    assert fixed_draft_lens(recipe.bench, recipe, True, None) == [3]
    assert fixed_draft_lens(recipe.bench, recipe, True, "http://h:1") == []


def test_reference_server_serves_a_fixed_chain_on_request(tuned_bundle):
    from specconvert.serving.engine import load_engine

    root, _ = tuned_bundle
    engine_dir = root / "work" / "engine"
    tuned = load_engine(engine_dir, "m", device="cpu")
    fixed = load_engine(engine_dir, "m", device="cpu", draft_len=2)
    try:
        assert tuned.description["max_draft_len"] == 1  # the bundle's tuned choice at batch 1
        assert fixed.description["max_draft_len"] == 2 and fixed.description["speculative"] is True
    finally:
        tuned.close()
        fixed.close()


def test_trtllm_fixed_arm_drops_the_schedule_and_shares_the_gpu(tmp_path):
    from specconvert.bench.servers import _shared_memory_options

    source = tmp_path / "llm_api_options.yaml"
    source.write_text(yaml.safe_dump({"speculative_config": {"decoding_type": "Eagle3", "max_draft_len": 3,
                                                             "draft_len_schedule": {2: 3, 8: 1}},
                                      "kv_cache_config": {"free_gpu_memory_fraction": 0.9}}))
    fixed = yaml.safe_load(_shared_memory_options(source, tmp_path / "f.yaml", 3, 2).read_text())
    assert fixed["speculative_config"] == {"decoding_type": "Eagle3", "max_draft_len": 2}
    assert fixed["kv_cache_config"]["free_gpu_memory_fraction"] == pytest.approx(0.3)
    same = yaml.safe_load(_shared_memory_options(source, tmp_path / "s.yaml", 3).read_text())
    assert same["speculative_config"]["draft_len_schedule"] == {2: 3, 8: 1}
    assert os.path.exists(tmp_path / "s.yaml") and Path(source).read_text().count("draft_len_schedule") == 1


def _safetensors(path: Path, tensors: dict) -> None:
    """A real safetensors file (zeros) of {name: (dtype, numel)}."""
    import struct

    width = {"BF16": 2, "F32": 4, "I64": 8}
    header, offset = {}, 0
    for name, (dtype, numel) in tensors.items():
        header[name] = {"dtype": dtype, "shape": [numel], "data_offsets": [offset, offset + numel * width[dtype]]}
        offset += numel * width[dtype]
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def test_weights_are_counted_at_the_serving_dtype(tmp_path):
    """float32 serving of a bf16 checkpoint holds twice the file's floats; int tensors (d2t) keep their size."""
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    _safetensors(tmp_path / "t" / "model.safetensors", {"w": ("BF16", 1024 ** 2), "d2t": ("I64", 1024)})
    mib = 1024 ** 2 / memory.GIB
    stored = 2 * mib + 8192 / memory.GIB
    assert memory.weights_gib([tmp_path / "t"], "bfloat16") == pytest.approx(stored)
    assert memory.weights_gib([tmp_path / "t"], "auto") == pytest.approx(stored)
    assert memory.weights_gib([tmp_path / "t"], "float32") == pytest.approx(4 * mib + 8192 / memory.GIB)
    # a float32 checkpoint under `auto` is downcast to 16 bits by vLLM (_resolve_auto_dtype)
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "config.json").write_text(json.dumps({"dtype": "float32"}))
    _safetensors(tmp_path / "f" / "model.safetensors", {"w": ("F32", 1024 ** 2)})
    assert memory.weights_gib([tmp_path / "f"], "auto") == pytest.approx(2 * mib)
    assert memory.weights_gib([tmp_path / "f"], "float32") == pytest.approx(4 * mib)
    # a pickle has no header: its size scaled by serving / config dtype
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    (tmp_path / "b" / "pytorch_model.bin").write_bytes(b"\0" * 4096)
    assert memory.weights_gib([tmp_path / "b"], "float32") == pytest.approx(8192 / memory.GIB)


def test_the_ram_decision_uses_the_serving_dtype(tmp_path, monkeypatch):
    """2 servers of a 1 GiB bf16 checkpoint: together at bf16 (2 x 4.5 GiB), not at float32 (2 x 5.5 GiB) in 10 GiB."""
    from types import SimpleNamespace

    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    header = json.dumps({"w": {"dtype": "BF16", "shape": [512 * 1024 ** 2],
                               "data_offsets": [0, 1024 ** 3]}}).encode()
    import struct

    with open(tmp_path / "t" / "model.safetensors", "wb") as fh:  # sparse: 1 GiB on paper
        fh.write(struct.pack("<Q", len(header)) + header)
        fh.truncate(8 + len(header) + 1024 ** 3)
    monkeypatch.setattr(memory, "available_gib", lambda *a, **k: 10.0)
    runtime = SimpleNamespace(vllm_kv_cache_gib=1, vllm_servers="auto", vllm_dtype="bfloat16")
    assert memory.choose_for(runtime, 2, [tmp_path / "t"])[0] == "together"
    assert memory.choose_for(SimpleNamespace(**{**vars(runtime), "vllm_dtype": "float32"}), 2,
                             [tmp_path / "t"])[0] == "sequential"
