"""backends.vllm.overlay.findings: concrete departures of the vLLM draft overlay from the head, one row per fault."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from specconvert.backends.vllm import overlay
from specconvert.serving import oracle
from specconvert.acceptance import from_counts

AUX = [2, 15, 27]


def head(path):
    path.mkdir()
    save_file({"d2t": torch.arange(4) * 3, "norm.weight": torch.full((8,), 1.5), "fc.weight": torch.ones(8, 24)},
              str(path / "model.safetensors"))
    return path


def make_overlay(tmp_path, draft, config=None, tensors=None):
    ov = tmp_path / "overlay"
    ov.mkdir()
    (ov / "config.json").write_text(json.dumps(config or {"eagle_aux_hidden_state_layer_ids": AUX}))
    if tensors is None:
        os.symlink(draft / "model.safetensors", ov / "model.safetensors")
    else:
        save_file(tensors, str(ov / "model.safetensors"))
    return ov


GOOD = {"d2t": torch.arange(4) * 3, "norm.weight": torch.full((8,), 1.5), "fc.weight": torch.ones(8, 24)}


@pytest.mark.parametrize("config, tensors, causes", [
    pytest.param(None, None, [], id="as-built"),
    pytest.param(None, dict(GOOD), [], id="copied-unchanged"),
    pytest.param({"eagle_aux_hidden_state_layer_ids": [1, 14, 26]}, None, ["aux_layers"], id="aux-off-by-one"),
    pytest.param({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 14, 26]}}, None, ["aux_layers"],
                 id="aux-only-in-eagle-config"),
    pytest.param({"eagle_aux_hidden_state_layer_ids": AUX, "norm_before_residual": True}, None, ["norm"], id="norm-layout"),
    pytest.param(None, {**GOOD, "d2t": torch.zeros(4, dtype=torch.int64)}, ["d2t"], id="identity-d2t"),
    pytest.param(None, {k: v for k, v in GOOD.items() if k != "norm.weight"}, ["norm"], id="norm-missing"),
    pytest.param(None, {k: v for k, v in GOOD.items() if k != "d2t"}, ["d2t"], id="d2t-missing"),
])
def test_findings(tmp_path, config, tensors, causes):
    draft = head(tmp_path / "draft")
    ov = make_overlay(tmp_path, draft, config, tensors)
    assert [f["cause"] for f in overlay.findings(ov, draft, AUX)] == causes


def test_a_finding_leads_the_oracle_message():
    engine = from_counts("x", drafts=10, draft_tokens=30, accepted_tokens=5, accepted_per_position=[4, 1, 0])
    reference = from_counts("y", drafts=10, draft_tokens=30, accepted_tokens=29, accepted_per_position=[10, 10, 9])
    found = [{"cause": "aux_layers", "detail": "config.json: eagle_aux_hidden_state_layer_ids [1] expected [2]"}]
    verdict = oracle.compare(engine, reference, oracle.OracleTolerance(0.2, 0.1), found)
    assert verdict["causes"][0] == "aux_layers" and "found in the engine's files" in verdict["message"]
    # Acceptance that agrees does not excuse files that depart from the head: still a failure, named.
    agree = oracle.compare(reference, reference, oracle.OracleTolerance(0.2, 0.1), found)
    assert not agree["passed"] and agree["causes"][0] == "aux_layers" and agree["caught_by"] == ["engine files"]
    clean = oracle.compare(reference, reference, oracle.OracleTolerance(0.2, 0.1), [])
    assert clean["passed"] and clean["causes"] == []


TRAINED = [1, 14, 26]  # the head's own record: output of layers 1, 14, 26 (vLLM ids = these + 1 = AUX)


def head_with_record(path, trained=TRAINED):
    head(path)
    (path / "config.json").write_text(json.dumps({"eagle_config": {"eagle_aux_hidden_state_layer_ids": trained}}))
    return path


@pytest.mark.parametrize("config, build_wrote, checks", [
    pytest.param({"eagle_aux_hidden_state_layer_ids": AUX}, AUX, [], id="right"),
    # build's numbering helper forgets the +1: the overlay holds exactly what build wrote, so only the
    # convention check, derived from vLLM's reading rules and the head's record, sees it
    pytest.param({"eagle_aux_hidden_state_layer_ids": TRAINED}, TRAINED, ["convention"], id="build-forgot-the-shift"),
    pytest.param({"eagle_aux_hidden_state_layer_ids": TRAINED}, AUX, ["convention", "integrity"], id="edited-after-build"),
    # no top-level list: vLLM takes eagle_config's unshifted, so the output-numbered list is one layer early
    pytest.param({"eagle_config": {"eagle_aux_hidden_state_layer_ids": TRAINED}}, None, ["convention"],
                 id="fallback-unshifted"),
    pytest.param({"eagle_aux_hidden_state_layer_ids": [], "eagle_config": {"eagle_aux_hidden_state_layer_ids": AUX}},
                 None, [], id="empty-top-level-falls-back"),
])
def test_aux_layers_are_checked_against_the_heads_record_by_vllms_rules(tmp_path, config, build_wrote, checks):
    """Issue 20, item 11: the ids vLLM 0.32 reads, mapped to the layers it captures, equal the head's trained layers,
    whatever build recorded."""
    draft = head_with_record(tmp_path / "draft")
    ov = make_overlay(tmp_path, draft, config)
    found = [f for f in overlay.findings(ov, draft, build_wrote) if f["cause"] == "aux_layers"]
    assert [f["check"] for f in found] == checks
    if "convention" in checks:
        assert "output of target layers [0, 13, 25]" in found[0]["detail"] and "[1, 14, 26]" in found[0]["detail"]


def test_vllms_reading_rules():
    assert overlay.aux_ids_vllm_reads({"eagle_aux_hidden_state_layer_ids": [3], "eagle_config": {
        "eagle_aux_hidden_state_layer_ids": [9]}}) == ("eagle_aux_hidden_state_layer_ids", [3])
    assert overlay.aux_ids_vllm_reads({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [9]}})[1] == [9]
    assert overlay.aux_ids_vllm_reads({})[1] is None
    assert overlay.layers_vllm_captures([2, 15, 27]) == TRAINED
