"""The synthesis vLLM's lifecycle without vLLM: a stdlib stand-in (tests/helpers/synthesis_server.py) started through
``VllmSource``: serve-test's start loop (a taken port retried), the served model id checked, and a dead engine's own
last error quoted instead of "cannot connect"."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from specconvert.errors import ExternalFailure
from specconvert.training.answers import GREEDY, AnswerCache, answer_all

FAKE = Path(__file__).resolve().parents[1] / "helpers" / "synthesis_server.py"


@pytest.fixture
def source(tmp_path, monkeypatch):
    from specconvert.backends.vllm import launch
    from specconvert.recipe import validate_recipe
    from specconvert.training.answers.vllm import VllmSource

    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setattr(launch, "find_python", lambda *a, **k: sys.executable)
    recipe = validate_recipe({"name": "demo", "target": {"model": "t"},
                              "draft": {"train": {"synthesis": {"engine": "vllm", "startup_timeout_s": 30,
                                                                "retries": 0}}}}, base_dir=tmp_path)
    made = VllmSource(recipe.draft.train.synthesis, recipe, tmp_path / "target", "float32", [2], None, tmp_path / "logs")
    served_name = {"name": "demo-synthesis"}
    monkeypatch.setattr(VllmSource, "command", lambda self, python, port: (
        [sys.executable, str(FAKE), str(port), served_name["name"], str(state)], None))
    made.state, made.served_name = state, served_name
    yield made
    made.close()


def test_a_port_taken_before_vllm_binds_it_is_retried_on_another(source, tmp_path):
    (source.state / "taken").write_text("")
    with source:
        got = answer_all(source, {(0, 0): [1, 2]}, AnswerCache(tmp_path / "c.jsonl"), 8, GREEDY)
    assert got == {(0, 0): [5, 6, 2]}
    assert "address already in use" in source.log_path.read_text()  # the first try, logged, then another port


def test_a_server_listing_another_model_on_our_port_is_refused(source):
    source.served_name["name"] = "someone-elses-model"
    with pytest.raises(ExternalFailure) as err:
        source.start()
    assert "someone-elses-model" in err.value.one_line() and "demo-synthesis" in err.value.one_line()
    assert not source.running


def test_an_engine_that_dies_at_start_is_quoted_from_its_log(source):
    (source.state / "die-at-start").write_text("Unsupported CPU attention configuration (head_dim=16)")
    with pytest.raises(ExternalFailure) as err:
        source.start()
    line = err.value.one_line()
    assert err.value.exit_code == 4 and "Unsupported CPU attention configuration (head_dim=16)" in line
    assert "synthesis-vllm.log" in line


def test_an_engine_that_dies_mid_run_is_quoted_not_cannot_connect(source, tmp_path):
    with source:
        source.start()
        (source.state / "die-on-request").write_text("Unsupported CPU attention configuration (head_dim=16)")
        with pytest.raises(ExternalFailure) as err:
            answer_all(source, {(0, 0): [1, 2]}, AnswerCache(tmp_path / "c.jsonl"), 8, GREEDY)
    line = err.value.one_line()
    assert "exited with code 1" in line and "RuntimeError: Unsupported CPU attention configuration" in line
    assert "is the server running" not in line
