"""One install route for TensorRT-LLM (issue 34, item 9): the release container, and the pip constraints.

The Dockerfile cannot be built here (no registry, no GPU), so what can be checked is checked: every
instruction is well formed, the base image is NVIDIA's release container and its default tag is one the
data lists. Whether pip resolves constraints-trtllm.txt needs PyPI: that test runs only when asked
(`make check-install`, SPECCONVERT_CHECK_INSTALL=1), never in `make test`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import REPO

DOCKERFILE = REPO / "docker/Dockerfile"
CONTAINERS = REPO / "specconvert/data/trtllm/containers.json"
INSTRUCTIONS = {"FROM", "ARG", "RUN", "COPY", "WORKDIR", "ENV", "LABEL", "CMD", "ENTRYPOINT", "USER", "EXPOSE"}


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per logical line, continuations joined; a malformed line fails the test."""
    out: list[tuple[str, str]] = []
    pending = ""
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        joined = (pending + " " + line).strip() if pending else line
        if joined.endswith("\\"):
            pending = joined[:-1].rstrip()
            continue
        pending = ""
        word, _, args = joined.partition(" ")
        assert word in INSTRUCTIONS, f"line {number}: {word!r} is not a Dockerfile instruction"
        assert args.strip(), f"line {number}: {word} without arguments"
        out.append((word, args.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def test_dockerfile_is_well_formed_and_uses_the_release_container_from_the_data():
    data = json.loads(CONTAINERS.read_text())
    steps = instructions(DOCKERFILE.read_text())
    words = [w for w, _ in steps]
    assert words[0] == "ARG" and words[1] == "FROM"  # the tag's ARG precedes FROM, so --build-arg can change it
    name, _, default = steps[0][1].partition("=")
    assert name == "TRTLLM_TAG"
    assert steps[1][1] == f"{data['image']}:${{{name}}}"
    tags = {r["tag"] for r in data["releases"].values()}
    assert default in tags and default == data["releases"][data["default"]]["tag"]
    run = " ".join(a for w, a in steps if w == "RUN")
    assert "pip install" in run and "-c /tmp/container-pins.txt ." in run
    assert words.count("FROM") == 1 and words.index("COPY") < words.index("RUN")


def test_every_listed_release_line_has_option_names():
    data = json.loads(CONTAINERS.read_text())
    for line, entry in data["releases"].items():
        options = CONTAINERS.parent / entry["options"]
        assert json.loads(options.read_text())["family"] == line
        assert re.fullmatch(r"\d+\.\d+\.\d+(rc\d+)?(\.post\d+)?", entry["tag"]) and entry["tag"].startswith(line + ".")


@pytest.mark.parametrize("bad, message", [
    ("FROM x\nRUN\n", "RUN without arguments"),
    ("FRM x\n", "'FRM' is not a Dockerfile instruction"),
    ("FROM x\nRUN a \\\n", "ends inside a continued line"),
], ids=["empty-run", "typo", "dangling-continuation"])
def test_the_parser_refuses_malformed_files(bad, message):
    with pytest.raises(AssertionError, match=re.escape(message)):
        instructions(bad)


def test_constraints_pin_the_tensorrt_llm_stack_like_the_compat_tests():
    pins = [line for line in (REPO / "constraints-trtllm.txt").read_text().splitlines() if line and not line.startswith("#")]
    compat = (REPO / "constraints-compat.txt").read_text()
    assert pins == ["transformers==4.57.3", "nvidia-modelopt>=0.37,<0.38"]
    assert all(pin in compat for pin in pins)  # the pair `make test-compat` runs the tests on
    assert not any(pin.startswith("torch") for pin in pins)  # TensorRT-LLM brings its own CUDA torch


@pytest.mark.skipif(os.environ.get("SPECCONVERT_CHECK_INSTALL") != "1",
                    reason="needs PyPI: `make check-install` (SPECCONVERT_CHECK_INSTALL=1)")
def test_constraints_resolve_with_pips_resolver(tmp_path):
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                           "--report", str(report), "-c", str(REPO / "constraints-trtllm.txt"), str(REPO)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    chosen = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    assert chosen["transformers"] == "4.57.3"
    assert chosen["nvidia-modelopt"].startswith("0.37.")
