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
