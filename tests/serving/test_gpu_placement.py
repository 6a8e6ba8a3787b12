"""Where tune's and bench's vLLM servers run on a GPU box (issue 34, item 2): the GPU inventory and the placement.

The inventory is read from a fake ``nvidia-smi`` (tests/helpers/fake_cuda.py); placements are asserted for the
boxes users have (one H100, four, tensor parallelism 2), never timings.
"""

from __future__ import annotations

import pytest

from specconvert.backends import gpus
from specconvert.backends.vllm import launch, placement
from specconvert.errors import EnvironmentMissing, InputError
from specconvert.models import size
from specconvert.recipe import BuildSpec, RuntimeSpec
from tests.helpers.fake_cuda import fake_cuda  # noqa: F401  (fixture)
from tests.helpers.real_configs import LLAMA_31_8B_INSTRUCT, write_config_only_model

GIB = 1024 ** 3
TUNE = ["k1", "k2", "k3", "k0-drafter", "k0"]  # tune's servers for max_draft_len 3, plain decoding's last
BENCH = ["baseline", "fixed-k3", "speculative"]


def _cvd(p: placement.Placement) -> dict[str, str | None]:
    return {s["label"]: s["cuda_visible_devices"] for s in p.as_dict()["servers"]}


def test_the_inventory_reads_nvidia_smi_and_honours_cuda_visible_devices(fake_cuda, monkeypatch):  # noqa: F811
    fake_cuda([(80, 80), (80, 12.5), (40, 40)])
    found = gpus.inventory()
    assert found.source == "nvidia-smi" and found.count == 3
    assert [(g.visible_id, g.total_bytes // GIB, g.free_bytes / GIB) for g in found.gpus] == [
        ("0", 80, 80.0), ("1", 80, 12.5), ("2", 40, 40.0)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")  # the child's value names the parent's own entries
    assert [g.visible_id for g in gpus.inventory().gpus] == ["2", "0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-fake0000-0000-0000-0000-000000000001")
    assert [(g.visible_id[:4], g.free_bytes / GIB) for g in gpus.inventory().gpus] == [("GPU-", 12.5)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpus.inventory().count == 0


def test_an_unreadable_nvidia_smi_is_no_inventory():
    assert gpus.parse_nvidia_smi("NVIDIA-SMI has failed because it couldn't communicate with the driver") is None
    assert gpus.parse_nvidia_smi("0, GPU-a, 81559, 81000\n1, GPU-b, 81559, 100\n", ["1", "7", "0"])[0].free_bytes == 100 * 1024 ** 2


def _inv(*pairs: tuple[float, float]) -> gpus.Inventory:
    return gpus.Inventory(tuple(gpus.Gpu(str(i), int(t * GIB), int(f * GIB)) for i, (t, f) in enumerate(pairs)),
                          "nvidia-smi")


# one row per box: (servers, runtime.vllm_servers, tensor parallel, GPUs (total, free GiB), waves, CUDA_VISIBLE_DEVICES)
CASES = [
    pytest.param(BENCH, "auto", 1, [(80, 80)] * 4, [BENCH],
                 {"baseline": "0", "fixed-k3": "1", "speculative": "2"}, id="4-gpus-tp1-bench-together"),
    pytest.param(TUNE, "auto", 1, [(80, 80)] * 4, [TUNE[:4], TUNE[4:]],
                 {"k1": "0", "k2": "1", "k3": "2", "k0-drafter": "3", "k0": "0"}, id="4-gpus-tp1-tune-5-servers"),
    pytest.param(TUNE, "auto", 2, [(80, 80)] * 4, [TUNE[:2], TUNE[2:4], TUNE[4:]],
                 {"k1": "0,1", "k2": "2,3", "k3": "0,1", "k0-drafter": "2,3", "k0": "0,1"}, id="4-gpus-tp2-two-at-a-time"),
    pytest.param(BENCH, "auto", 1, [(80, 80)], [[b] for b in BENCH],
                 {b: "0" for b in BENCH}, id="1-gpu-sequential"),
    pytest.param(BENCH, "auto", 1, [(80, 80), (80, 5), (80, 80), (80, 80)], [BENCH],
                 {"baseline": "0", "fixed-k3": "2", "speculative": "3"}, id="a-busy-gpu-is-skipped"),
    pytest.param(BENCH, "sequential", 1, [(80, 80)] * 4, [[b] for b in BENCH],
                 {b: "0" for b in BENCH}, id="sequential-asked"),
]


@pytest.mark.parametrize("labels, mode, tp, box, waves, cvd", CASES)
def test_servers_are_placed_on_gpus_of_their_own(labels, mode, tp, box, waves, cvd):
    p = placement.place_on_gpus(labels, mode, tp, None, _inv(*box))
    assert [list(w) for w in p.waves] == waves
    assert _cvd(p) == cvd
    assert p.memory_fraction == {}  # never squeezed unasked: each keeps vLLM's own fraction
    assert p.as_dict()["gpus"]["count"] == len(box) and p.why


def test_together_on_one_gpu_shares_it_with_equal_fractions():
    p = placement.place_on_gpus(["baseline", "speculative"], "together", 1, None, _inv((80, 80)))
    assert p.together and p.memory_fraction == {"baseline": 0.46, "speculative": 0.46}
    assert "--gpu-memory-utilization 0.46 each" in p.why
    server = launch.ServerLaunch("baseline", ["py", "-m", "m", "--dtype", "auto", "--seed", "0"], {}, "x")
    placed = p.apply(server)
    assert placed.argv == ["py", "-m", "m", "--dtype", "auto", "--gpu-memory-utilization", "0.46", "--seed", "0"]
    assert placed.env == {"CUDA_VISIBLE_DEVICES": "0"}


def test_together_is_refused_when_a_share_cannot_hold_a_server():
    """Five 8B servers (bf16 weights ~15 GiB each) squeezed onto one 80 GiB GPU: 0.18 of it each is too little."""
    floor = size.server_floor_bytes(LLAMA_31_8B_INSTRUCT, "auto", 1, 8192)
    assert 15 * GIB < floor < 20 * GIB
    with pytest.raises(InputError, match="share a GPU 5 ways"):
        placement.place_on_gpus(TUNE, "together", 1, None, _inv((80, 80)), floor)


def test_no_gpu_with_room_is_an_environment_problem():
    with pytest.raises(EnvironmentMissing, match="no 1 GPU"):
        placement.place_on_gpus(BENCH, "auto", 1, None, _inv((80, 20), (80, 30)))
    # a smaller fraction asked by the recipe fits where vLLM's own 0.92 does not
    p = placement.place_on_gpus(BENCH, "auto", 1, 0.3, _inv((80, 20), (80, 30)))
    assert _cvd(p) == {"baseline": "1", "fixed-k3": "1", "speculative": "1"}


def test_an_unknown_inventory_runs_one_server_at_a_time():
    p = placement.place_on_gpus(BENCH, "auto", 1, None, gpus.Inventory((), "none: test"))
    assert p.mode == "sequential" and p.env == {} and "inventory unknown" in p.why


def test_place_sizes_from_the_config_only_target(tmp_path, fake_cuda):  # noqa: F811
    """``place`` reads the GPUs and the target's config (no weights here): together on 1 GPU refused for 5 servers."""
    fake_cuda(1)
    target = write_config_only_model(tmp_path, LLAMA_31_8B_INSTRUCT, "llama")
    runtime = RuntimeSpec(device="cuda", vllm_servers="together")
    values = launch.launch_values(runtime)
    with pytest.raises(InputError):
        placement.place(TUNE, runtime, BuildSpec(max_draft_len=3, max_seq_len=8192), values, [target, None])
    runtime = RuntimeSpec(device="cuda")
    p = placement.place(TUNE, runtime, BuildSpec(max_draft_len=3), values, [target, None])
    assert p.mode == "sequential" and set(_cvd(p).values()) == {"0"}
