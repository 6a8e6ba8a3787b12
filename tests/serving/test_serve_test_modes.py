"""serve-test's lossless modes on the reference server (tiny bundle)."""

from __future__ import annotations


def test_lossless_off_starts_no_baseline_and_checks_acceptance_only(project, cli):
    result = cli("serve-test", project.recipe_path, "--set", "serve_test.lossless.mode=off", "--json")
    assert result.code == 0, result.stderr[-3000:]
    report = result.json()
    names = [c["name"] for c in report["checks"]]
    assert not any(n.startswith("lossless") for n in names)
    assert any(n.startswith("acceptance length") for n in names)
    assert report["models"] == {"speculative": "tiny-serve"}
    assert all(not row["errors"] for row in report["prompts"])  # no "baseline: not run" in JUnit


def test_yaml_on_off_spellings_mean_the_modes():
    import yaml

    from specconvert.recipe import LosslessSpec, OracleSpec

    assert LosslessSpec(**yaml.safe_load("mode: off")).mode == "off"
    assert OracleSpec(**yaml.safe_load("enabled: on")).enabled == "on"
    assert OracleSpec(**yaml.safe_load("enabled: off")).enabled == "off"
