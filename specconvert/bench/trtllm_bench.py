"""``bench --trtllm-bench``: TensorRT-LLM's own ``trtllm-bench latency`` on the bundle, beside our report.

Runs ``<workdir>/engine/trtllm/bench.sh`` (which uses the bundle's ``dataset.jsonl``)
once speculative and once with ``OPTIONS=baseline.yaml``, each writing its
``--report_json`` into the bench directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .. import output
from ..errors import EnvironmentMissing, ExternalFailure, InputError

EXECUTABLE = "trtllm-bench"


def require_trtllm_bench(engine_dir: Path) -> Path:
    """The bundle's bench.sh, once trtllm-bench is on PATH (exit 3 otherwise, before anything is measured)."""
    script = engine_dir / "trtllm" / "bench.sh"
    if not script.is_file():
        raise InputError(f"{script} is missing", fix="run `specconvert build RECIPE` for a bundle with TensorRT-LLM files")
    if shutil.which(EXECUTABLE) is None:
        raise EnvironmentMissing(
            f"{EXECUTABLE} is not on PATH (--trtllm-bench)",
            fix="install TensorRT-LLM (`pip install --extra-index-url https://pypi.nvidia.com tensorrt_llm`) or run inside "
            "NVIDIA's TensorRT-LLM container; or drop --trtllm-bench")
    return script


def run_trtllm_bench(script: Path, out_dir: Path, compare_baseline: bool, timeout_s: float) -> dict[str, Any]:
    """Run bench.sh for each side; return where the reports and logs are, and what they say."""
    trt = script.parent
    sides = [("speculative", trt / "llm_api_options.yaml")]
    if compare_baseline:
        sides.insert(0, ("baseline", trt / "baseline.yaml"))
    result: dict[str, Any] = {"script": str(script), "dataset": str(trt / "dataset.jsonl"), "reports": {}, "logs": {},
                              "summaries": {}}
    for label, options in sides:
        report = out_dir / f"trtllm_bench_{label}.json"
        log = out_dir / f"trtllm_bench_{label}.log"
        env = {**os.environ, "OPTIONS": str(options), "REPORT": str(report)}
        output.log(f"bench: trtllm-bench latency ({label})")
        with open(log, "wb") as fh:
            try:
                proc = subprocess.run(["bash", str(script)], stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=env, cwd=out_dir, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise ExternalFailure(f"trtllm-bench ({label}) ran past {timeout_s:g} s", fix=f"see {log}") from None
        if proc.returncode != 0:
            tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-3:]
            raise ExternalFailure(f"trtllm-bench ({label}) exited with code {proc.returncode}: {' | '.join(tail)}",
                                  fix=f"see {log}")
        if not report.is_file():
            raise ExternalFailure(f"trtllm-bench ({label}) wrote no report at {report}", fix=f"see {log}")
        result["reports"][label] = str(report)
        result["logs"][label] = str(log)
        try:
            result["summaries"][label] = json.loads(report.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            result["summaries"][label] = None
    return result
