"""The vLLM TEST DOUBLE's per-batch schedule sees the batch really in flight (issue 20, item 10): requests sent
together are decoded in the same steps, and each step drafts what the schedule gives for that batch size."""

from __future__ import annotations

import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from specconvert.serving.process import free_port


@pytest.fixture
def scheduled_double(fake_vllm, tmp_path):
    """The double serving a chain of 2 at batch 1 and nothing from batch 2 on."""
    exe, _ = fake_vllm
    port = free_port("127.0.0.1")
    spec = {"method": "eagle3", "model": "d", "num_speculative_tokens": 2,
            "num_speculative_tokens_per_batch_size": [[1, 1, 2], [2, 8, 0]]}
    # four requests from four threads must join one batch: a window of 0.5 s holds them on a loaded machine too (the
    # default 0.05 s did not when another job held both cores)
    proc = subprocess.Popen([str(exe), "-m", "vllm.entrypoints.openai.api_server", "--served-model-name", "m",
                             "--speculative-config", json.dumps(spec), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "FAKE_VLLM_BATCH_WINDOW_S": "0.5"})
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if requests.get(url + "/health", timeout=1).ok:
                    break
            except requests.ConnectionError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _counters(url: str) -> tuple[float, float]:
    lines = requests.get(url + "/metrics", timeout=5).text.splitlines()
    value = {line.split("{")[0]: float(line.split()[-1]) for line in lines if line.startswith("vllm:spec")}
    return value["vllm:spec_decode_num_drafts_total"], value["vllm:spec_decode_num_accepted_tokens_total"]


def _ask(url: str) -> list[int]:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 9, "return_token_ids": True}
    return requests.post(url + "/v1/chat/completions", json=body, timeout=30).json()["choices"][0]["token_ids"]


def test_the_schedule_drafts_at_batch_1_and_not_above(scheduled_double):
    url = scheduled_double
    assert _ask(url) == list(range(9))
    drafts, accepted = _counters(url)
    assert (drafts, accepted) == (3.0, 5.0)  # alone: 8 tokens after the prefill in steps of 3, 3, 2
    with ThreadPoolExecutor(4) as pool:  # four together: batch 4, the schedule gives 0, nothing drafted
        assert list(pool.map(lambda _: _ask(url), range(4))) == [list(range(9))] * 4
    assert _counters(url) == (drafts, accepted)
