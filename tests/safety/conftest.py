"""Fixtures for the workdir-safety tests: a small build project (hand-written convert stage,
no model load), a subprocess runner for fault injection, and a tree hash."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
AUX_IDS = [1, 3, 4]


def tree_hash(root: Path) -> dict[str, str]:
    """Every entry below ``root`` (dot-folders too) -> content hash, link target or 'dir'."""
    out: dict[str, str] = {}
    for path in sorted(Path(root).rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = "link:" + os.readlink(path)
        elif path.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


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

    def write_convert(self, **decisions) -> dict:
        manifest = {
            "manifest_version": 1,
            "stage": "convert",
            "fingerprint": "test",
            "artifacts": {"target_dir": str(self.target_dir), "draft_dir": str(self.draft_dir)},
            "decisions": {"aux_layer_ids": AUX_IDS, "draft_vocab_size": 64, **decisions},
            "target": {"num_hidden_layers": 8, "hidden_size": 64, "vocab_size": 128,
                       "max_position_embeddings": 8192, "dtype": "bfloat16", "architecture": "LlamaForCausalLM"},
            "draft": {"max_position_embeddings": 8192, "dtype": "bfloat16"},
            "quantization": {"format": "none", "kv_cache_quant_algo": None},
        }
        convert = self.workdir / "convert"
        convert.mkdir(parents=True, exist_ok=True)
        (convert / "manifest.json").write_text(json.dumps(manifest, indent=2))
        return manifest


@pytest.fixture
def project(tmp_path: Path) -> Project:
    """A recipe whose convert stage is written by hand, so `build --no-load` runs without torch."""
    target = tmp_path / "models" / "target"
    draft = tmp_path / "models" / "draft"
    target.mkdir(parents=True)
    draft.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 8}))
    (target / "model.safetensors").write_bytes(b"\0" * 64)
    (draft / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 64,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": AUX_IDS, "use_aux_hidden_state": True},
    }))
    (draft / "model.safetensors").write_bytes(b"\1" * 32)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "schema_version": 1, "name": "tiny-safety", "workdir": "work",
        "target": {"model": str(target), "dtype": "bfloat16"}, "draft": {"model": str(draft)},
        "build": {"max_draft_len": 3}, "runtime": {"backend": "trtllm", "trtllm_version": "1.3"},
    }, sort_keys=False))
    project = Project(tmp_path, recipe, tmp_path / "work", target, draft)
    project.write_convert()
    return project


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SPECCONVERT_FAULT", "SPECCONVERT_LOCK_TIMEOUT")}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", SPECCONVERT_DEBUG="0")
    env.update(extra or {})
    return env


def run_cli(*args, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m specconvert ARGS` in a child process (this tree first on the path)."""
    return subprocess.run([sys.executable, "-m", "specconvert", *map(str, args)], env=_env(env),
                          capture_output=True, text=True, timeout=timeout)


def start_cli(*args, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "specconvert", *map(str, args)], env=_env(env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def child_pids() -> list[int]:
    """Live (non-zombie) children of this test process."""
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == me and fields[0] != "Z":
            found.append(int(entry.name))
    return found
