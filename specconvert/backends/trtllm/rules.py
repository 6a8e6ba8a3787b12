"""EAGLE-3 feature combinations checked before any GPU time is spent.

One function, :func:`check`, used by ``build`` and ``doctor`` alike. It returns
errors (the recipe cannot work; each names the fix), warnings, and the fixes it
applied on its own (only where the recipe left the setting at its default).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .versions import TargetVersion

# TorchLlmArgs keys that carry a logits post-processor (not combinable with EAGLE-3).
LOGITS_PROCESSOR_KEYS = ("batched_logits_processor",)


@dataclass
class RuleReport:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    fixes: dict[str, Any] = field(default_factory=dict)  # recipe key -> value used instead
    trtllm_tree: bool = False  # whether TRT-LLM gets the dynamic tree (else: chain of max_draft_len)

    def as_dict(self) -> dict[str, Any]:
        return {"errors": self.errors, "warnings": self.warnings, "fixes": self.fixes, "trtllm_tree": self.trtllm_tree}


def _is_bf16(dtype: Any) -> bool:
    return str(dtype or "").lower().replace("torch.", "") in ("bfloat16", "bf16")


def kv_cache_is_fp8(build: Any, convert: dict[str, Any] | None) -> bool:
    """FP8 KV cache: asked for in the recipe, or `auto` over a checkpoint quantized with an FP8 KV cache."""
    if build.kv_cache.dtype == "fp8":
        return True
    if build.kv_cache.dtype == "auto" and convert:
        algo = (convert.get("quantization") or {}).get("kv_cache_quant_algo")
        return str(algo or "").upper() == "FP8"
    return False


def check(recipe: Any, convert: dict[str, Any] | None, target: TargetVersion) -> RuleReport:
    """Apply every EAGLE-3 combination rule to ``recipe`` (+ the convert manifest when there is one)."""
    report = RuleReport()
    build = recipe.build
    extra = build.extra_llm_api_options or {}

    if build.pipeline_parallel_size > 1:
        report.errors.append(
            f"build.pipeline_parallel_size: {build.pipeline_parallel_size}: TensorRT-LLM does not combine EAGLE-3 "
            "with pipeline parallelism. Fix: set build.pipeline_parallel_size: 1 and scale with "
            "build.tensor_parallel_size (and build.moe_expert_parallel_size for MoE targets)"
        )
    if build.sampler == "trtllm" or str(extra.get("sampler_type", "")).upper() == "TRTLLMSAMPLER":
        report.errors.append(
            "build.sampler: trtllm: the C++ TRTLLMSampler is not combinable with EAGLE-3. "
            "Fix: set build.sampler: torch (or auto, which picks TorchSampler)"
        )
    for key in LOGITS_PROCESSOR_KEYS:
        if extra.get(key) is not None:
            report.errors.append(
                f"build.extra_llm_api_options.{key}: logits post-processors are not combinable with EAGLE-3. "
                f"Fix: remove {key}"
            )
    spec = extra.get("speculative_config")
    if spec is not None:
        kind = spec.get("decoding_type") if isinstance(spec, dict) else None
        if str(kind).upper() == "MTP":
            report.errors.append(
                "build.extra_llm_api_options.speculative_config: MTP cannot be combined with EAGLE-3. "
                "Fix: remove speculative_config; the EAGLE-3 config is generated from build.*"
            )
        else:
            report.errors.append(
                "build.extra_llm_api_options.speculative_config: the speculative config is generated from "
                "build.max_draft_len / build.tree and the convert stage. Fix: remove speculative_config"
            )

    # FP8 KV cache with block reuse and a bf16 draft KV cache.
    if build.kv_cache.enable_block_reuse and kv_cache_is_fp8(build, convert):
        draft_dtype = ((convert or {}).get("draft") or {}).get("dtype")
        if convert is None or _is_bf16(draft_dtype):
            explicit = "enable_block_reuse" in build.kv_cache.model_fields_set
            if explicit:
                report.errors.append(
                    "build.kv_cache.enable_block_reuse: true with an FP8 KV cache and a bfloat16 draft: "
                    "TensorRT-LLM needs block reuse off for this combination. Fix: set "
                    "build.kv_cache.enable_block_reuse: false"
                )
            else:
                report.fixes["build.kv_cache.enable_block_reuse"] = False
                report.warnings.append(
                    "FP8 KV cache with a bfloat16 draft: block reuse turned off (build.kv_cache.enable_block_reuse: "
                    "false); set it explicitly to silence this warning"
                )

    _draft_precision(report, recipe, convert, target)

    if build.temperature > 0 and target.spelling.greedy_only:
        report.warnings.append(
            f"build.temperature: {build.temperature}: TensorRT-LLM {target.version} runs EAGLE-3 greedy only; "
            "sampled requests will not follow the target distribution there (the reference backend samples losslessly)"
        )

    if convert:
        draft_ctx = (convert.get("draft") or {}).get("max_position_embeddings")
        if draft_ctx and build.max_seq_len > int(draft_ctx):
            report.warnings.append(
                f"build.max_seq_len: {build.max_seq_len} exceeds the draft's max_position_embeddings ({draft_ctx}); "
                "acceptance may fall on long sequences"
            )
        target_ctx = (convert.get("target") or {}).get("max_position_embeddings")
        if target_ctx and build.max_seq_len > int(target_ctx):
            report.warnings.append(
                f"build.max_seq_len: {build.max_seq_len} exceeds the target's max_position_embeddings ({target_ctx})"
            )

    if build.tree is not None:
        if target.spelling.dynamic_tree:
            report.trtllm_tree = True
            if build.tree.total_tokens - 1 > build.tree.top_k * build.tree.depth:
                report.warnings.append(
                    f"build.tree.total_tokens - 1 ({build.tree.total_tokens - 1}) exceeds top_k * depth "
                    f"({build.tree.top_k * build.tree.depth}); TensorRT-LLM's max_total_draft_tokens is capped there"
                )
        else:
            report.warnings.append(
                f"build.tree is set but TensorRT-LLM {target.version} drafts one chain for EAGLE-3: the TensorRT-LLM "
                f"bundle uses a chain of build.max_draft_len ({build.max_draft_len}) tokens; the tree applies to the "
                "reference backend (and the SGLang launch file) only"
            )
    return report


# --------------------------------------------------------------------------- draft precision
# The draft stays in its own precision when the target is quantized. The rules and their
# TensorRT-LLM citations are data (specconvert/data/trtllm/draft_precision.json), like the
# option windows; the conditions they name are evaluated here.

def draft_quant_config(draft_dir: Any) -> list[str]:
    """What in a draft folder would make an engine load the head as quantized weights."""
    import json
    from pathlib import Path

    from ..launch import DRAFT_QUANT_FILES

    if not draft_dir:
        return []
    folder = Path(draft_dir)
    found = [name for name in DRAFT_QUANT_FILES if (folder / name).is_file()]
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    if isinstance(config, dict) and config.get("quantization_config"):
        found.append("config.json quantization_config")
    return found


def draft_precision_rules() -> list[dict[str, Any]]:
    import json
    from importlib import resources

    text = (resources.files("specconvert") / "data" / "trtllm" / "draft_precision.json").read_text(encoding="utf-8")
    return json.loads(text)["rules"]


def _draft_precision(report: RuleReport, recipe: Any, convert: dict[str, Any] | None, target: TargetVersion) -> None:
    from .versions import in_release_window

    extra = recipe.build.extra_llm_api_options or {}
    draft_dir = ((convert or {}).get("artifacts") or {}).get("draft_dir")
    found = draft_quant_config(draft_dir)
    kv_fp8 = kv_cache_is_fp8(recipe.build, convert)
    conditions = {
        "draft_folder_has_quant_config": bool(found),
        "target_kv_cache_fp8": kv_fp8,
        "target_kv_cache_fp8_and_chunked_prefill": kv_fp8 and bool(extra.get("enable_chunked_prefill")),
    }
    fields = {"draft_dir": draft_dir, "found": ", ".join(found),
              "draft_dtype": ((convert or {}).get("draft") or {}).get("dtype") or "unquantized"}
    for rule in draft_precision_rules():
        if not conditions.get(rule["when"]) or not in_release_window(target.version, rule.get("first"), rule.get("last")):
            continue
        text = f"TensorRT-LLM {target.version}: " + rule["message"].format(**fields)
        if rule.get("fix"):
            text += ". Fix: " + rule["fix"].format(**fields)
        (report.errors if rule["severity"] == "error" else report.warnings).append(text)
