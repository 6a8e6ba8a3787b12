"""Version -> spelling table and the option-name data every emitted key is checked against."""

from __future__ import annotations

import pytest
import yaml

from specconvert.backends.trtllm import options as trt_options
from specconvert.backends.trtllm import versions
from specconvert.errors import InputError


@pytest.mark.parametrize(
    "version, family, decoding_type, model_key",
    [
        ("1.2", "1.2", "Eagle", "speculative_model_dir"),
        ("1.2.1", "1.2", "Eagle", "speculative_model_dir"),
        ("1.3.0rc27", "1.3", "Eagle3", "speculative_model"),
        ("1.3.2", "1.3", "Eagle3", "speculative_model"),
        ("1.4.0rc1", "1.4", "Eagle3", "speculative_model"),
    ],
)
def test_spelling_per_version(version, family, decoding_type, model_key):
    spelling, warnings = versions.spelling_for(version)
    assert (spelling.family, spelling.decoding_type, spelling.model_key) == (family, decoding_type, model_key)
    assert warnings == []


def test_only_1_2_needs_the_one_model_flag_and_is_greedy_only():
    by_family = {s.family: s for s in versions.SPELLINGS}
    assert by_family["1.2"].fixed == {"eagle3_one_model": True} and by_family["1.2"].greedy_only
    assert by_family["1.3"].fixed == {} and not by_family["1.3"].greedy_only


def test_older_than_1_2_is_an_input_error():
    with pytest.raises(InputError, match="older than the oldest supported"):
        versions.spelling_for("1.1.0")


def test_newer_than_known_uses_newest_spelling_with_warning():
    spelling, warnings = versions.spelling_for("1.7.0")
    assert spelling.family == versions.SPELLINGS[-1].family
    assert warnings and "newer than the newest line" in warnings[0]


def test_not_a_version():
    with pytest.raises(InputError, match="not a version"):
        versions.parse_version("latest")


def test_resolve_auto_without_install_uses_newest_known_and_says_so():
    target = versions.resolve("auto", installed=None, detect=False)
    assert target.version == versions.NEWEST_KNOWN and target.source == "newest-known"
    assert any("not installed" in w for w in target.warnings)


def test_resolve_installed_wins_over_pin_with_warning():
    target = versions.resolve("1.2", installed="1.3.0rc27")
    assert target.source == "installed" and target.spelling.family == "1.3"
    assert any("runtime.trtllm_version is 1.2" in w for w in target.warnings)


def test_resolve_pin_without_install():
    target = versions.resolve("1.2", installed=None, detect=False)
    assert (target.version, target.source, target.spelling.family) == ("1.2", "recipe", "1.2")
    assert target.warnings == ()


@pytest.mark.parametrize("family", ["1.2", "1.3", "1.4"])
def test_option_data_cites_sources(family):
    data = trt_options.option_names(family)
    assert data["family"] == family
    urls = [u for src in data["source"] for u in src.get("urls", [])]
    assert urls and all(u.startswith("https://") for u in urls)
    assert "llm_args.py" in " ".join(src.get("where", "") for src in data["source"])


@pytest.mark.parametrize(
    "family, stale_key",
    [
        ("1.2", "speculative_model"),  # 1.3+ spelling
        ("1.3", "eagle3_one_model"),  # gone by 1.3.0rc27
        ("1.3", "greedy_sampling"),
        ("1.3", "speculative_model_dir"),
        ("1.4", "eagle_choices"),  # dropped in 1.4.0rc1
        ("1.4", "num_eagle_layers"),  # dropped in 1.4.0rc4
    ],
)
def test_removed_keys_are_flagged(family, stale_key):
    decoding_type = "Eagle" if family == "1.2" else "Eagle3"
    options = {"max_batch_size": 1, "speculative_config": {"decoding_type": decoding_type, stale_key: 1}}
    assert trt_options.unknown_keys(options, family) == [f"speculative_config.{stale_key}"]
    with pytest.raises(trt_options.OptionSpellingError, match=stale_key):
        trt_options.assert_known(options, family)


def test_unknown_nested_and_top_level_keys_are_flagged():
    options = {"max_batchsize": 1, "kv_cache_config": {"enable_block_reuse": True, "reuse": 1}}
    assert trt_options.unknown_keys(options, "1.3") == ["max_batchsize", "kv_cache_config.reuse"]


def test_1_3_has_no_eagle_decoding_type_in_our_table():
    # specconvert only writes Eagle3 for 1.3+; an `Eagle` config there is flagged, not written.
    assert "Eagle" not in trt_options.option_names("1.3")["speculative_config"]


@pytest.mark.parametrize("version", ["1.2", "1.3"])
def test_every_key_in_the_written_file_is_valid_for_its_version(project, cli, version):
    result = cli("build", project.recipe_path, "--no-load", "--set", f"runtime.trtllm_version={version}")
    assert result.code == 0, result.err
    for name in ("llm_api_options.yaml", "baseline.yaml"):
        written = yaml.safe_load((project.engine / "trtllm" / name).read_text())
        assert written, name
        assert trt_options.unknown_keys(written, version) == []
    keys = project.manifest()["decisions"]["keys_written"]["trtllm/llm_api_options.yaml"]
    assert "speculative_config.eagle3_layers_to_capture" in keys


def test_a_stale_spelling_in_the_table_fails_before_writing(project, cli, monkeypatch):
    # Simulate a bug: the 1.3 line emitting the removed 1.2 flag.
    broken = versions.Spelling("1.3", (1, 3, 0), "Eagle3", "speculative_model", "Eagle3DecodingConfig",
                               fixed={"eagle3_one_model": True})
    monkeypatch.setattr(versions, "SPELLINGS", (versions.SPELLINGS[0], broken, versions.SPELLINGS[2]))
    result = cli("build", project.recipe_path, "--no-load", "--set", "runtime.trtllm_version=1.3")
    assert result.code == 1
    assert "OptionSpellingError" in result.err and "speculative_config.eagle3_one_model" in result.err
    assert not project.engine.exists()
    assert [p.name for p in project.workdir.iterdir()] == ["convert"]


# ---------------------------------------------------------------- release granularity (issue 12)


@pytest.mark.parametrize(
    "older, newer",
    [("1.3.0rc20", "1.3.0rc27"), ("1.3.0rc27", "1.3"), ("1.3.0rc27", "1.3.0"), ("1.4.0rc1", "1.4.0rc4"),
     ("1.3.2", "1.4.0rc1"), ("1.3.0", "1.3.0.post1")],
    ids=lambda v: v,
)
def test_releases_order_at_rc_granularity(older, newer):
    assert versions.parse_release(older) < versions.parse_release(newer)
    # the line-level parse cannot tell release candidates apart; the release-level one must
    assert versions.parse_version("1.3.0rc20") == versions.parse_version("1.3.0rc27")


@pytest.mark.parametrize(
    "version, key, accepted",
    [
        ("1.3.0rc20", "speculative_config.acceptance_rate_threshold", False),
        ("1.3.0rc20", "speculative_config.acceptance_rate_window_size", False),
        ("1.3.0rc20", "speculative_config.advanced_sampling_mode", False),
        ("1.3.0rc20", "speculative_config.enable_penalty", False),
        ("1.3.0rc27", "speculative_config.acceptance_rate_threshold", True),
        ("1.3", "speculative_config.enable_penalty", True),
        ("1.4.0rc1", "speculative_config.moe_tactic", False),
        ("1.4.0rc4", "speculative_config.moe_tactic", True),
        ("1.3.0rc24", "sampler_type", True),
        ("1.3.0rc26", "sampler_type", False),
        ("1.4.0rc4", "sampler_type", False),
        ("1.2.1", "sampler_type", True),
    ],
    ids=lambda v: str(v),
)
def test_option_names_carry_their_release_window(version, key, accepted):
    spelling, _ = versions.spelling_for(version)
    top, _, sub = key.partition(".")
    options = {top: {"decoding_type": spelling.decoding_type, sub: 1}} if sub else {top: "TorchSampler"}
    bad = trt_options.unknown_keys(options, spelling.family, version)
    assert (key not in bad) == accepted, bad


@pytest.mark.parametrize("family", ["1.3", "1.4"])
def test_release_windows_cite_their_source(family):
    releases = {k: v for k, v in trt_options.option_names(family)["releases"].items() if not k.startswith("_")}
    assert releases
    for key, window in releases.items():
        assert window.get("first") or window.get("last"), key
        assert window["source"] and all(u.startswith("https://") for u in window["urls"]), key


@pytest.mark.parametrize(
    "version, written",
    [("1.2", "TorchSampler"), ("1.3.0rc24", "TorchSampler"), ("1.3.0rc26", None), ("1.3.0rc27", None),
     ("1.4.0rc4", None)],
)
def test_sampler_type_is_written_only_where_it_exists(project, cli, version, written):
    result = cli("build", project.recipe_path, "--no-load", "--set", f"runtime.trtllm_version={version}",
                 "--set", "build.sampler=torch")
    assert result.code == 0, result.err
    options = yaml.safe_load((project.engine / "trtllm" / "llm_api_options.yaml").read_text())
    assert options.get("sampler_type") == written


def test_sampler_type_through_extra_options_is_refused_where_removed(project, cli):
    result = cli("build", project.recipe_path, "--no-load", "--set", "runtime.trtllm_version=1.3.0rc27",
                 "--set", "build.extra_llm_api_options.sampler_type=TorchSampler")
    assert result.code == 2
    assert "sampler_type" in result.err and "up to TensorRT-LLM 1.3.0rc24" in result.err
    assert not project.engine.exists()


DISABLE = ("--set", "build.disable_below_acceptance_length.threshold=2.5",
           "--set", "build.disable_below_acceptance_length.window=64")


@pytest.mark.parametrize(
    "version, expected",
    [
        ("1.2", {"acceptance_window": 64, "acceptance_length_threshold": 2.5}),
        # max_draft_len 3: rate = (2.5 - 1) / 3
        ("1.3.0rc27", {"acceptance_rate_window_size": 64, "acceptance_rate_threshold": 0.5}),
        ("1.4.0rc4", {"acceptance_rate_window_size": 64, "acceptance_rate_threshold": 0.5}),
    ],
)
def test_auto_disable_is_written_in_each_lines_spelling_and_meaning(project, cli, version, expected):
    result = cli("build", project.recipe_path, "--no-load", "--set", f"runtime.trtllm_version={version}",
                 "--set", "build.max_draft_len=3", *DISABLE)
    assert result.code == 0, result.err
    spec = yaml.safe_load((project.engine / "trtllm" / "llm_api_options.yaml").read_text())["speculative_config"]
    assert {k: spec[k] for k in expected} == expected
    other = {"acceptance_window", "acceptance_length_threshold", "acceptance_rate_window_size",
             "acceptance_rate_threshold"} - set(expected)
    assert not other & set(spec)
    baseline = yaml.safe_load((project.engine / "trtllm" / "baseline.yaml").read_text())
    assert "speculative_config" not in baseline


@pytest.mark.parametrize(
    "extra, first_line",
    [
        (("--set", "runtime.trtllm_version=1.3.0rc20"), "acceptance_rate_threshold exists from 1.3.0rc27 on"),
        (("--set", "runtime.trtllm_version=1.4.0rc4", "--set", "build.disable_below_acceptance_length.threshold=4.5"),
         "exceeds the most a chain of 3 can reach"),
    ],
    ids=["1.3-before-rc27", "threshold-above-max"],
)
def test_auto_disable_refused_where_it_cannot_mean_the_same(project, cli, extra, first_line):
    result = cli("build", project.recipe_path, "--no-load", "--set", "build.max_draft_len=3", *DISABLE, *extra)
    assert result.code == 2
    assert first_line in result.err and "build.disable_below_acceptance_length" in result.err
    assert not project.engine.exists()


def test_auto_disable_threshold_must_be_a_length(project, cli):
    result = cli("build", project.recipe_path, "--no-load", "--set", "build.disable_below_acceptance_length.threshold=0.5",
                 "--set", "build.disable_below_acceptance_length.window=8")
    assert result.code == 2 and "disable_below_acceptance_length.threshold" in result.err


def test_resolve_warns_when_the_pinned_release_candidate_is_not_the_installed_one():
    target = versions.resolve("1.3.0rc20", installed="1.3.0rc27")
    assert target.version == "1.3.0rc27"
    assert any("runtime.trtllm_version is 1.3.0rc20" in w for w in target.warnings)
    assert versions.resolve("1.3.0rc27", installed="1.3.0rc27").warnings == ()


@pytest.mark.parametrize("version, line", [("1.2", "1.2"), ("1.3.0rc20", "1.3-early"), ("1.3.0rc27", "1.3"),
                                           ("1.4.0rc4", "1.4")])
def test_manifest_decisions_name_the_acceptance_line(version, line):
    assert versions.resolve(version, installed=None, detect=False).as_dict()["trtllm_acceptance_line"] == line
