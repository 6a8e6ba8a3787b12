"""Progress in CI logs (issue 35): without a TTY, plain lines (one per 10 % or 30 s), never carriage-return
frames, and the libraries' tqdm bars off."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ..conftest import REPO

CONSUMER = """
import time
from specconvert import output
output.quiet_library_bars()
with output.progress() as bar:
    task = bar.add_task("synthesize answers", total=1000)
    for _ in range(1000):
        bar.advance(task)
    train = bar.add_task("train EAGLE-3 head", total=50, completed=10)
    for step in range(40):
        bar.update(train, advance=1, description=f"train EAGLE-3 head  loss {1 / (step + 1):.3f}")
# what transformers' GGUF loader does: a bare tqdm.auto bar (transformers/modeling_gguf_pytorch_utils.py)
from tqdm.auto import tqdm
for _ in tqdm(range(300), desc="Converting and de-quantizing GGUF tensors..."):
    pass
from transformers.utils import logging as hf_logging
for _ in hf_logging.tqdm(range(300), desc="Loading weights"):
    pass
"""


def _run(env_progress: str | None = None) -> subprocess.CompletedProcess:
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("SPECCONVERT_PROGRESS", "TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS")}
    if env_progress is not None:
        env["SPECCONVERT_PROGRESS"] = env_progress
    # stdout and stderr are pipes: no TTY, as in CI. Bytes, not text: text mode would turn each "\r" into "\n".
    return subprocess.run([sys.executable, "-c", CONSUMER], capture_output=True, cwd=REPO, env=env, timeout=300)


def test_no_tty_gives_a_few_lines_and_no_carriage_returns():
    proc = _run()
    assert proc.returncode == 0, proc.stderr
    assert b"\r" not in proc.stderr and b"\r" not in proc.stdout
    lines = proc.stderr.decode().split("\n")[:-1]
    synth = [line for line in lines if line.startswith("synthesize answers")]
    train = [line for line in lines if line.startswith("train EAGLE-3 head")]
    assert len(synth) == 2 and len(train) == 2, lines  # a task of a second: start and done only
    assert synth[0] == "synthesize answers: 0/1000 (0%), 0:00 (started)"
    assert synth[-1].startswith("synthesize answers: 1000/1000 (100%)") and synth[-1].endswith("(done)")
    assert train[0].startswith("train EAGLE-3 head: 10/50 (20%)") and "(resumed)" in train[0]
    assert "loss 0.025" in train[-1]  # the latest description
    assert len(lines) == len(synth) + len(train), lines  # the tqdm bars printed nothing


def test_off_prints_nothing():
    proc = _run("off")
    assert proc.returncode == 0 and proc.stderr == b""


def test_the_check_sees_carriage_returns_when_bars_are_on():
    """The same consumer with the bars forced on writes carriage-return frames: the check above can fail."""
    proc = _run("bar")
    assert proc.returncode == 0 and b"\r" in proc.stderr


def test_a_line_every_30_seconds_when_a_tenth_takes_longer():
    from specconvert.output import LineProgress

    now = [0.0]
    bar = LineProgress(clock=lambda: now[0])
    lines = []
    import io
    from contextlib import redirect_stderr

    with redirect_stderr(io.StringIO()) as err:
        task = bar.add_task("synthesize answers", total=1000)
        for _ in range(50):  # 50 answers, 5 % of the total, over 150 s
            now[0] += 3.0
            bar.advance(task)
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 + 5, lines  # started, then one per 30 s
    assert lines[1] == "synthesize answers: 10/1000 (1%), 0:30"
    assert lines[-1] == "synthesize answers: 50/1000 (5%), 2:30"


@pytest.mark.parametrize("value, tty, style", [
    (None, False, "lines"), (None, True, "bar"), ("bar", False, "bar"), ("1", False, "bar"), ("lines", True, "lines"),
    ("off", True, "off"), ("0", False, "off"),
])
def test_specconvert_progress_chooses_the_style(monkeypatch, value, tty, style):
    from specconvert import output

    if value is None:
        monkeypatch.delenv("SPECCONVERT_PROGRESS", raising=False)
    else:
        monkeypatch.setenv("SPECCONVERT_PROGRESS", value)
    monkeypatch.setattr(output, "_isatty", lambda stream: tty)
    output.set_mode(False, False)
    assert output.progress_style() == style
    output.set_mode(False, quiet=True)
    assert output.progress_style() == "off"
    output.set_mode(False, False)


def test_a_line_per_tenth_when_a_tenth_takes_longer_than_5_seconds():
    import io
    from contextlib import redirect_stderr

    from specconvert.output import LineProgress

    now = [0.0]
    bar = LineProgress(clock=lambda: now[0])
    with redirect_stderr(io.StringIO()) as err:
        task = bar.add_task("train EAGLE-3 head", total=100)
        for _ in range(100):  # 2 s a step: 20 s per tenth
            now[0] += 2.0
            bar.advance(task)
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 + 9 + 1, lines  # started, 10 % .. 90 %, done
    assert lines[1] == "train EAGLE-3 head: 10/100 (10%), 0:20"
    assert lines[-1] == "train EAGLE-3 head: 100/100 (100%), 3:20 (done)"
