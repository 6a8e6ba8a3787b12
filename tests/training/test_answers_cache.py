"""The synthesis cache says who answered: engine, served model id, redacted endpoint, request_extra, sampling; for
in-process answers the target's dtype and device. A served cache without the record of a passed probe beside it (made
elsewhere, copied in) is reused only after the probe passes against the endpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from specconvert.recipe import TrainSpec
from specconvert.training.answers import GREEDY
from specconvert.training.answers.inprocess import InProcessSource
from specconvert.training.answers.url import ServedSource
from specconvert.training.data import build_sequences
from tests.helpers.openai_double import Double
from tests.tiny_models import byte_tokenizer, write_tiny_target

STOP = 255


class Bar:
    def add_task(self, *a, **k):
        return 0

    def advance(self, *a):
        pass


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import torch
    from transformers import AutoModelForCausalLM

    path = write_tiny_target(tmp_path_factory.mktemp("target"), logit_scale=30.0, eos_token_id=STOP)
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def _data(tmp_path: Path) -> Path:
    rows = [{"prompt": f"hello {i} world"} for i in range(4)]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    return tmp_path


def _served(model, name="tiny"):
    target = InProcessSource(model, [STOP], 0, 1)

    def answer(prompt, max_tokens):
        got = {}
        target.answer([((0, 0), prompt)], max_tokens, GREEDY, lambda k, a: got.setdefault(k, a))
        return got[(0, 0)]

    def logprobs(prompt, ids):
        return [lp for lp, _, _ in target.score(prompt, ids)]

    return Double(answer, model=name, logprobs=logprobs)


def _train():
    return TrainSpec(prompts="p.jsonl", max_new_tokens=6, seq_len=64, synthesis={"engine": "url", "urls": ["http://x:1"],
                                                                                  "probe_prompts": 2, "probe_tokens": 6})


def _run(tiny, base, cache, url, model=None):
    return build_sequences(_train(), base, tiny, byte_tokenizer(), [STOP], cache, "fp", Bar(),
                           source=ServedSource([url], model, [STOP]))


def test_two_served_models_fill_two_caches_and_the_probes_gap_is_reported(tiny, tmp_path):
    base = _data(tmp_path)
    with _served(tiny, "a") as a, _served(tiny, "b") as b:
        _, report = _run(tiny, base, tmp_path / "cache", a.url)
        _run(tiny, base, tmp_path / "cache", b.url)
    caches = sorted(p.name for p in (tmp_path / "cache").glob("synthesis-*.jsonl"))
    assert len(caches) == 2  # a's answers are not b's
    assert report.probe[0]["mean_gap"] is not None and report.probe[0]["mean_gap"] < 1e-4
    assert report.probe[0]["tokens"] == report.probe_tokens > 0 and report.probe[0]["endpoint"].endswith(a.url)


def test_a_cache_copied_in_without_its_probe_record_is_probed_before_reuse(tiny, tmp_path):
    base = _data(tmp_path)
    with _served(tiny) as double:
        first, _ = _run(tiny, base, tmp_path / "here", double.url)
        asked = len(double.requests)
        again, report = _run(tiny, base, tmp_path / "here", double.url)  # made and probed here: read back, no request
        assert len(double.requests) == asked and report.probe_tokens == 0
        shutil.copytree(tmp_path / "here", tmp_path / "elsewhere", ignore=shutil.ignore_patterns("*.probe.json"))
        double.perturb_at = 0  # the endpoint now serves another model: the copied cache must not be trusted
        from specconvert.errors import InputError

        with pytest.raises(InputError, match="does not answer as the target"):
            _run(tiny, base, tmp_path / "elsewhere", double.url)
        double.perturb_at = None
        copied, report = _run(tiny, base, tmp_path / "elsewhere", double.url)
    assert report.probe_tokens > 0 and report.synthesis_cached == 4  # probed, then every answer read back
    assert [s.input_ids for s in copied] == [s.input_ids for s in first] == [s.input_ids for s in again]


def test_the_inprocess_key_names_the_targets_dtype_and_device(tiny):
    assert InProcessSource(tiny, [STOP], 0, 1).identity() == {"engine": "inprocess", "dtype": "float32", "device": "cpu"}
