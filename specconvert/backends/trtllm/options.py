"""The LLM-API options TensorRT-LLM reads (``--extra_llm_api_options`` / ``LLM(**options)``).

Every key written is checked against the option names of the targeted version
(``specconvert/data/trtllm/options/<family>.json``) before anything is written:
TensorRT-LLM forbids unknown keys, so one stale spelling stops the server.
"""

from __future__ import annotations

import difflib
import json
from functools import lru_cache
from importlib import resources
from typing import Any

from ...errors import InputError
from .rules import RuleReport
from .versions import TargetVersion, in_release_window

# Sub-configs whose keys are checked one level down.
_NESTED = ("kv_cache_config", "cuda_graph_config")


class OptionSpellingError(RuntimeError):
    """specconvert itself emitted a key the targeted TensorRT-LLM version does not know (a bug)."""


# Requests whose metrics trtllm-serve keeps for /perf_metrics (emptied on each read; a no-op on 1.4).
PERF_METRICS_MAX_REQUESTS = 1024


@lru_cache(maxsize=None)
def option_names(family: str) -> dict[str, Any]:
    """The option-name data of one version line (with its sources)."""
    path = resources.files("specconvert") / "data" / "trtllm" / "options" / f"{family}.json"
    return json.loads(path.read_text(encoding="utf-8"))


def release_window(family: str, key: str) -> dict[str, Any] | None:
    """First/last release of ``family`` that accepts ``key`` (dotted for sub-configs); None = the whole line."""
    return option_names(family).get("releases", {}).get(key)


def outside_release(key: str, family: str, version: str | None) -> str | None:
    """Why ``version`` does not accept ``key`` although its line does (None when it does, or no version given)."""
    window = release_window(family, key)
    if version is None or not isinstance(window, dict):
        return None
    if in_release_window(version, window.get("first"), window.get("last")):
        return None
    if window.get("first"):
        return f"{key} is accepted from TensorRT-LLM {window['first']} on"
    return f"{key} is accepted up to TensorRT-LLM {window['last']} only"


def unknown_keys(options: dict[str, Any], family: str, version: str | None = None) -> list[str]:
    """Dotted paths of keys in ``options`` that ``family`` (and, given, release ``version``) does not accept."""
    names = option_names(family)
    bad: list[str] = []

    def check(path: str, known: bool) -> None:
        if not known or outside_release(path, family, version):
            bad.append(path)

    for key, value in options.items():
        if key not in names["top_level"]:
            bad.append(key)
            continue
        check(key, True)
        if key in _NESTED and isinstance(value, dict):
            for sub in value:
                check(f"{key}.{sub}", sub in names[key])
        if key == "speculative_config" and isinstance(value, dict):
            allowed = names["speculative_config"].get(str(value.get("decoding_type")))
            if allowed is None:
                bad.append(f"speculative_config.decoding_type={value.get('decoding_type')}")
            else:
                for sub in value:
                    check(f"speculative_config.{sub}", sub in allowed)
    return bad


def assert_known(options: dict[str, Any], family: str, version: str | None = None) -> None:
    bad = unknown_keys(options, family, version)
    if bad:
        raise OptionSpellingError(
            f"internal error: options not accepted by TensorRT-LLM {version or family + '.x'}: {', '.join(bad)} "
            f"(specconvert/data/trtllm/options/{family}.json)"
        )


def flatten_keys(options: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in options.items():
        path = f"{prefix}{key}"
        keys.append(path)
        if isinstance(value, dict):
            keys += flatten_keys(value, path + ".")
    return keys


def speculative_config(
    target: TargetVersion, build: Any, draft_dir: str, aux_layer_ids: list[int], report: RuleReport
) -> dict[str, Any]:
    """The EAGLE-3 ``speculative_config`` in the spelling of ``target``."""
    spelling = target.spelling
    config: dict[str, Any] = {"decoding_type": spelling.decoding_type, "max_draft_len": build.max_draft_len}
    config[spelling.model_key] = draft_dir
    config.update(spelling.fixed)
    # TRT-LLM does not read the checkpoint's aux list; its default {1, N//2-1, N-4} matches only
    # heads trained with that default, so the layers are always written explicitly.
    config["eagle3_layers_to_capture"] = sorted(int(i) for i in aux_layer_ids)
    if report.trtllm_tree and build.tree is not None:
        tree = build.tree
        config["max_draft_len"] = tree.depth
        config["use_dynamic_tree"] = True
        config["dynamic_tree_max_topK"] = tree.top_k
        config["max_total_draft_tokens"] = max(tree.depth, min(tree.total_tokens - 1, tree.top_k * tree.depth))
    config.update(auto_disable(target, build, config))
    return config


def auto_disable(target: TargetVersion, build: Any, config: dict[str, Any]) -> dict[str, Any]:
    """``build.disable_below_acceptance_length`` in the spelling and meaning of ``target``'s line.

    1.2 (``DecodingBaseConfig`` in tensorrt_llm/llmapi/llm_args.py, 1.2-era): ``acceptance_window`` N
    completed requests, ``acceptance_length_threshold`` a length: written as given.
    1.3.0rc27+ and 1.4 (``Eagle3DecodingConfig`` API reference at 1.3.0rc27 / 1.4.0rc4): a rolling
    average over ``acceptance_rate_window_size`` speculating iterations of the "true acceptance rate
    (accepted_draft_tokens / drafted_tokens)", 0..1. A chain drafts ``max_draft_len`` tokens per step and
    tau = 1 + accepted per step, so rate = (tau - 1) / max_draft_len.
    """
    setting = getattr(build, "disable_below_acceptance_length", None)
    if setting is None:
        return {}
    if target.spelling.family == "1.2":
        return {"acceptance_window": setting.window, "acceptance_length_threshold": setting.threshold}
    if outside_release("speculative_config.acceptance_rate_threshold", target.spelling.family, target.version):
        raise InputError(
            f"build.disable_below_acceptance_length: TensorRT-LLM {target.version} has no auto-disable setting "
            "(acceptance_rate_threshold exists from 1.3.0rc27 on)",
            fix="pin runtime.trtllm_version to 1.3.0rc27 or newer, or remove build.disable_below_acceptance_length",
        )
    if config.get("use_dynamic_tree"):
        raise InputError(
            "build.disable_below_acceptance_length: a dynamic tree drafts more tokens per step than it can accept, "
            "so an acceptance length has no fixed acceptance-rate equivalent on TensorRT-LLM 1.3+",
            fix="remove build.disable_below_acceptance_length, or draft a chain (build.tree: null)",
        )
    draft_len = int(config["max_draft_len"])
    rate = (setting.threshold - 1.0) / draft_len
    if rate > 1.0:
        raise InputError(
            f"build.disable_below_acceptance_length.threshold: {setting.threshold:g} exceeds the most a chain of "
            f"{draft_len} can reach ({draft_len + 1}), so speculation would always switch off",
            fix=f"set a threshold between 1 and {draft_len + 1}",
        )
    return {"acceptance_rate_window_size": setting.window, "acceptance_rate_threshold": round(rate, 6)}


def llm_api_options(
    target: TargetVersion,
    build: Any,
    report: RuleReport,
    speculative: dict[str, Any] | None,
) -> dict[str, Any]:
    """Options for ``llm_api_options.yaml`` (``speculative`` given) or ``baseline.yaml`` (None)."""
    options: dict[str, Any] = {
        "max_batch_size": build.max_batch_size,
        "max_num_tokens": build.max_num_tokens,
        "max_seq_len": build.max_seq_len,
        "tensor_parallel_size": build.tensor_parallel_size,
    }
    if build.moe_expert_parallel_size > 1:
        options["moe_expert_parallel_size"] = build.moe_expert_parallel_size
    if build.pipeline_parallel_size > 1 and speculative is None:
        options["pipeline_parallel_size"] = build.pipeline_parallel_size
    kv: dict[str, Any] = {
        "free_gpu_memory_fraction": build.kv_cache.free_gpu_memory_fraction,
        "enable_block_reuse": report.fixes.get("build.kv_cache.enable_block_reuse", build.kv_cache.enable_block_reuse),
    }
    if build.kv_cache.dtype != "auto":
        kv["dtype"] = build.kv_cache.dtype
    options["kv_cache_config"] = kv
    # cuda_graph_config: null turns CUDA graphs off in TRT-LLM's PyTorch backend.
    options["cuda_graph_config"] = (
        {"enable_padding": True, "max_batch_size": build.max_batch_size} if build.cuda_graphs else None
    )
    # sampler_type is gone from 1.3.0rc26 on (TorchSampler is the only sampler; see the `releases` entry in
    # the options data): `torch` is then the default and nothing is written.
    if build.sampler != "auto" and not outside_release("sampler_type", target.spelling.family, target.version) \
            and "sampler_type" in option_names(target.spelling.family)["top_level"]:
        options["sampler_type"] = {"torch": "TorchSampler", "trtllm": "TRTLLMSampler"}[build.sampler]
    # Where acceptance comes from (data/trtllm/acceptance_sources.json): specDecodingStats in the
    # iteration stats at /metrics need enable_iter_perf_stats; the Prometheus spec-decode counters
    # need return_perf_metrics too. perf_metrics_max_requests feeds /perf_metrics on 1.2/1.3 (whose
    # EAGLE-3 entries carry no acceptance) and is a no-op on 1.4, which removed the route.
    options["enable_iter_perf_stats"] = True
    options["return_perf_metrics"] = True
    options["perf_metrics_max_requests"] = PERF_METRICS_MAX_REQUESTS
    if speculative is not None:
        options["speculative_config"] = speculative

    names = option_names(target.spelling.family)
    for key, value in (build.extra_llm_api_options or {}).items():
        if key == "speculative_config":
            continue  # rejected by the rules
        if key in options:
            raise InputError(
                f"build.extra_llm_api_options.{key} is generated from the recipe",
                fix=f"set it through build.* instead (see `specconvert recipe schema`), or remove it",
            )
        if key not in names["top_level"]:
            guess = difflib.get_close_matches(key, names["top_level"], n=1, cutoff=0.6)
            hint = f"did you mean '{guess[0]}'? " if guess else ""
            raise InputError(
                f"build.extra_llm_api_options.{key}: not an option of TensorRT-LLM {target.version} "
                f"({target.spelling.family}.x)",
                fix=f"{hint}remove it, or pin runtime.trtllm_version to a version that has it",
            )
        why = outside_release(key, target.spelling.family, target.version)
        if why:
            raise InputError(
                f"build.extra_llm_api_options.{key}: not an option of TensorRT-LLM {target.version} ({why})",
                fix="remove it, or pin runtime.trtllm_version to a release that has it",
            )
        options[key] = value
    assert_known(options, target.spelling.family, target.version)
    return options


# NGram (prompt lookup) decoding, the free-speculation arm of `bench.baselines` (no head). Every supported line has
# it (``NGramDecodingConfig``, decoding_type "NGram", PyTorch backend; fields per release in the options data,
# sources there). 1.2's ``max_matching_ngram_size`` defaults to 0, so it is always written.
NGRAM_DECODING_TYPE = "NGram"


def ngram_speculative_config(target: TargetVersion, draft_len: int, ngram: Any) -> dict[str, Any]:
    """``speculative_config`` of the n-gram arm in ``target``'s spelling: ``max_draft_len`` tokens drafted from a match
    of at most ``bench.ngram.prompt_lookup_max`` tokens (TensorRT-LLM has no minimum match length)."""
    config = {"decoding_type": NGRAM_DECODING_TYPE, "max_draft_len": int(draft_len),
              "max_matching_ngram_size": int(ngram.prompt_lookup_max)}
    assert_known({"speculative_config": config}, target.spelling.family, target.version)
    return config


def ngram_options(baseline_options: dict[str, Any], target: TargetVersion, draft_len: int, ngram: Any) -> dict[str, Any]:
    """``ngram.yaml``: the baseline's options (same memory, batch and context) plus the n-gram ``speculative_config``."""
    options = {**baseline_options, "speculative_config": ngram_speculative_config(target, draft_len, ngram)}
    assert_known(options, target.spelling.family, target.version)
    return options
