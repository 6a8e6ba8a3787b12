"""`specconvert doctor`: environment report, exit codes 0/2/3, JSON shape."""

from __future__ import annotations

import subprocess

import pytest

from specconvert import doctor


def test_environment_only_exits_0_and_lists_versions(cli):
    result = cli("doctor", "--json")
    assert result.code == 0, result.err
    doc = result.json()
    assert doc["kind"] == "doctor" and doc["ok"] is True and doc["exit_code"] == 0
    names = {c["name"] for c in doc["checks"]}
    assert {"python", "torch", "transformers", "modelopt", "tensorrt_llm"} <= names
    assert doc["environment"]["libraries"]["transformers"]
    assert all(c["status"] in {"ok", "warn", "fail", "missing", "info"} for c in doc["checks"])


def test_reference_recipe_ok(project, cli):
    project.write_recipe(runtime={"backend": "reference", "device": "cpu"})
    result = cli("doctor", project.recipe_path, "--json")
    assert result.code == 0, result.err
    doc = result.json()
    assert doc["combinations"]["errors"] == []
    expected = sum(p.stat().st_size for d in (project.target_dir, project.draft_dir) for p in d.iterdir())
    assert doc["disk"]["model_bytes"] == expected
    assert doc["disk"]["free_bytes"] > 0


def test_trtllm_backend_without_tensorrt_llm_is_exit_3(project, cli, monkeypatch):
    monkeypatch.setattr(doctor, "installed_version", lambda dist: None if dist == "tensorrt_llm" else "1.0")
    result = cli("doctor", project.recipe_path, "--json")
    assert result.code == 3
    doc = result.json()
    assert doc["ok"] is False and doc["exit_code"] == 3
    assert "tensorrt_llm is not installed" in doc["reason"]
    assert "tensorrt_llm is not installed" in result.err


def test_combination_error_is_exit_2_even_when_environment_is_missing(project, cli):
    result = cli("doctor", project.recipe_path, "--set", "build.pipeline_parallel_size=2", "--json")
    assert result.code == 2
    doc = result.json()
    assert doc["exit_code"] == 2 and "pipeline parallelism" in doc["reason"]
    assert any(c["status"] == "fail" and c["name"] == "combination" for c in doc["checks"])


def test_invalid_recipe_is_exit_2(project, cli):
    result = cli("doctor", project.recipe_path, "--set", "runtime.backend=tensorrt")
    assert result.code == 2 and "runtime.backend" in result.err


def test_cuda_device_requested_without_gpu_is_exit_3(project, cli, monkeypatch):
    monkeypatch.setattr(doctor, "torch_cuda", lambda: {"torch": "2.13.0", "torch_cuda": None, "cuda_available": False})
    project.write_recipe(runtime={"backend": "reference", "device": "cuda"})
    result = cli("doctor", project.recipe_path)
    assert result.code == 3 and "runtime.device is cuda" in result.err
    assert "torch.cuda" in result.out  # the human table came first


def test_gpu_present_with_tensorrt_llm_is_ok(project, cli, monkeypatch):
    monkeypatch.setattr(doctor, "nvidia_smi", lambda: [
        {"name": "NVIDIA H200", "driver": "575.57", "memory_total_mib": "143771", "memory_free_mib": "143000"}])
    monkeypatch.setattr(doctor, "torch_cuda", lambda: {"torch": "2.9.0", "torch_cuda": "12.9", "cuda_available": True,
                                                       "device_count": 1, "devices": ["NVIDIA H200"]})
    monkeypatch.setattr(doctor, "installed_version", lambda dist: {"tensorrt_llm": "1.2.1"}.get(dist, "1.0"))
    monkeypatch.setattr(doctor.versions, "installed_version", lambda dist: {"tensorrt_llm": "1.2.1"}.get(dist))
    result = cli("doctor", project.recipe_path, "--json")
    assert result.code == 0, result.err
    doc = result.json()
    assert doc["trtllm_target"]["spelling_family"] == "1.2" and doc["trtllm_target"]["trtllm_version_source"] == "installed"
    assert any(c["name"] == "gpu 0" and "H200" in c["detail"] and "575.57" in c["detail"] for c in doc["checks"])


@pytest.mark.parametrize("bad_output", ["", "garbage"])
def test_nvidia_smi_unparseable_lines_are_ignored(monkeypatch, bad_output):
    monkeypatch.setattr(doctor.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(doctor.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=bad_output, stderr=""))
    assert doctor.nvidia_smi() == []


def test_nvidia_smi_line_parsed(monkeypatch):
    monkeypatch.setattr(doctor.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    line = "NVIDIA H200, 575.57.08, 143771, 140000\n"
    monkeypatch.setattr(doctor.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=line, stderr=""))
    assert doctor.nvidia_smi() == [{"name": "NVIDIA H200", "driver": "575.57.08", "memory_total_mib": "143771",
                                    "memory_free_mib": "140000"}]
