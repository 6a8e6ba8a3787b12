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
from .versions import TargetVersion

# Sub-configs whose keys are checked one level down.
_NESTED = ("kv_cache_config", "cuda_graph_config")


class OptionSpellingError(RuntimeError):
    """specconvert itself emitted a key the targeted TensorRT-LLM version does not know (a bug)."""


# Requests whose metrics trtllm-serve keeps for /perf_metrics (emptied on each read).
PERF_METRICS_MAX_REQUESTS = 1024


@lru_cache(maxsize=None)
def option_names(family: str) -> dict[str, Any]:
    """The option-name data of one version line (with its sources)."""
    path = resources.files("specconvert") / "data" / "trtllm" / "options" / f"{family}.json"
    return json.loads(path.read_text(encoding="utf-8"))


def unknown_keys(options: dict[str, Any], family: str) -> list[str]:
    """Dotted paths of keys in ``options`` that ``family`` does not accept."""
    names = option_names(family)
    bad: list[str] = []
    for key, value in options.items():
        if key not in names["top_level"]:
            bad.append(key)
            continue
        if key in _NESTED and isinstance(value, dict):
            bad += [f"{key}.{sub}" for sub in value if sub not in names[key]]
        if key == "speculative_config" and isinstance(value, dict):
            allowed = names["speculative_config"].get(str(value.get("decoding_type")))
            if allowed is None:
                bad.append(f"speculative_config.decoding_type={value.get('decoding_type')}")
            else:
                bad += [f"speculative_config.{sub}" for sub in value if sub not in allowed]
    return bad


def assert_known(options: dict[str, Any], family: str) -> None:
    bad = unknown_keys(options, family)
    if bad:
        raise OptionSpellingError(
            f"internal error: options not accepted by TensorRT-LLM {family}.x: {', '.join(bad)} "
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
    return config


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
    if build.sampler != "auto":
        options["sampler_type"] = {"torch": "TorchSampler", "trtllm": "TRTLLMSampler"}[build.sampler]
    # Acceptance statistics (specDecodingStats) come with the iteration stats; trtllm-serve's
    # per-request /perf_metrics (what serve-test and bench read) needs both keys below.
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
        options[key] = value
    assert_known(options, target.spelling.family)
    return options
