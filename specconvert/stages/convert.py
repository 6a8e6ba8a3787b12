"""The ``convert`` stage: target + EAGLE-3 head -> a canonical, validated pair.

Reads recipe ``target``, ``draft``, ``quantize``; writes ``<workdir>/convert/``:
``target/`` (the target's own copy, a reflink where the filesystem clones, or the
quantized HF checkpoint), ``draft/`` (canonical EAGLE-3 head), ``manifest.json``.
Every check that silently kills acceptance (hidden size, vocab, d2t range, aux
layers, rope, dims) runs before any heavy work, and the import proves itself
lossless by reading the exported tensors back.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import output, threads
from .._imports import require
from ..errors import InputError
from ..manifest import check_sealed, seal_tree, stage_dir, tree_fingerprint, up_to_date
from ..models.copying import copy_tree, source_files
from ..models.sources import ResolvedModel, resolve_model, save_tokenizer
from ..recipe import Recipe
from .preflight import check_target_weights, check_workdir, read_target_config
from ..workdir import check_replaceable, workdir_lock

STAGE = "convert"
_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


@dataclass
class ConvertPlan:
    """Everything decided before heavy work starts (the pre-flight result)."""

    target: ResolvedModel
    target_config: dict[str, Any]
    target_info: Any
    dtype: str
    head: Any | None  # CanonicalHead for an imported head
    head_source: ResolvedModel | None
    aux_layer_ids: list[int]
    aux_note: str
    head_layout: str | None = None
    warnings: list[str] = field(default_factory=list)


def stage_path(recipe: Recipe) -> Path:
    return recipe.workdir_path / "convert"


def _checkpoint_dtype(config: dict[str, Any]) -> str:
    return str(config.get("torch_dtype") or config.get("dtype") or "float32").replace("torch.", "")


def plan(recipe: Recipe, allow_pickle: bool = False) -> ConvertPlan:
    """Resolve sources and run every head/target compatibility check. No model is loaded."""
    from .. import heads as layouts

    target = resolve_model(recipe.target.model, "target.model", recipe.base_dir, recipe.target.revision)
    config = read_target_config(target.path)
    _check_remote_code(config, recipe)
    info = layouts.TargetInfo.from_config(config)
    check_target_weights(target.path)
    source_files(target.path, "target.model")  # refuses links that leave the folder, before anything is written
    dtype = recipe.target.dtype if recipe.target.dtype != "auto" else _checkpoint_dtype(config)
    if recipe.quantize.format != "none":
        from ..backends.modelopt.quantize import check_environment, check_shapes
        from ..prompts import load_samples

        check_environment(recipe.quantize.format, _device(recipe))
        check_shapes(recipe.quantize.format, config)
        # read now so a missing or malformed file stops the run before the target loads
        load_samples(recipe.quantize.calib_prompts, "quantize.calib_prompts", recipe.base_dir)
        if recipe.quantize.eval_prompts:
            from ..training.data import load_prompt_samples

            load_prompt_samples(recipe.quantize.eval_prompts, "quantize.eval_prompts", recipe.base_dir)

    warnings: list[str] = []
    head = head_source = head_layout = None
    if recipe.draft.model:
        head_source = resolve_model(recipe.draft.model, "draft.model", recipe.base_dir, need_config=False)
        checkpoint = layouts.read_head(head_source.path, recipe.draft.format, allow_pickle=allow_pickle)
        head = layouts.to_canonical(checkpoint)
        head_layout = checkpoint.layout
        problems = layouts.check_against_target(head, info)
        errors = [p for p in problems if p.severity == "error"]
        warnings += [f"{p.key}: {p.message}" for p in problems if p.severity != "error"]
        if errors:
            lines = [f"{p.key}: {p.message}; fix: {p.fix}" for p in errors]
            raise InputError(
                f"draft head {head_source.path} does not fit target {target.path}: {lines[0]}"
                + (f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""),
                problems=lines,
            )
        n_aux, head_aux = head.arch.n_aux, head.arch.aux_layer_ids
    else:
        from ..backends.modelopt.eagle import default_aux_layer_ids

        if recipe.draft.train is not None:
            from ..training.pipeline import preflight

            preflight(recipe, info.vocab_size)
        n_aux, head_aux = len(default_aux_layer_ids(info.num_hidden_layers)), None
        if recipe.draft.aux_layers != "auto":
            n_aux = len(recipe.draft.aux_layers)
    sources = [("target", target.path)] + ([("draft", head_source.path)] if head_source else [])
    check_workdir(recipe.workdir_path, sources)
    aux, note = layouts.resolve_aux_layers(
        recipe.draft.aux_layers, recipe.draft.aux_layer_convention, head_aux, n_aux, info.num_hidden_layers
    )
    return ConvertPlan(target, config, info, dtype, head, head_source, aux, note, head_layout, warnings)


def _check_remote_code(config: dict[str, Any], recipe: Recipe) -> None:
    if recipe.target.trust_remote_code or not config.get("auto_map"):
        return
    transformers = require("transformers")
    if config.get("model_type") in transformers.models.auto.configuration_auto.CONFIG_MAPPING:
        return
    raise InputError(
        f"target.model: the checkpoint's architecture ({config.get('model_type')}) needs its own modelling code",
        fix="review the code it ships, then set target.trust_remote_code: true",
    )


def _device(recipe: Recipe) -> str:
    if recipe.runtime.device != "auto":
        return recipe.runtime.device
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def fingerprint_inputs(recipe: Recipe, p: ConvertPlan, allow_pickle: bool) -> dict[str, Any]:
    from ..backends.modelopt.eagle import modelopt_version

    return {
        "recipe": recipe.section("target", "draft", "quantize"),
        "target_files": tree_fingerprint(p.target.path),
        "draft_files": tree_fingerprint(p.head_source.path) if p.head_source else None,
        "allow_pickle": allow_pickle,
        "modelopt": modelopt_version(),
        "train_data": _train_data_fingerprint(recipe),
    }


def _train_data_fingerprint(recipe: Recipe) -> dict[str, Any] | None:
    if recipe.draft.train is None:
        return None
    from ..training.pipeline import data_fingerprint

    return data_fingerprint(recipe)


def run(recipe: Recipe, force: bool = False, allow_pickle: bool = False) -> tuple[dict[str, Any], bool]:
    """Run the stage. Returns (manifest, skipped)."""
    # The lock covers training too: it writes the workdir's training cache before staging opens.
    with workdir_lock(recipe.workdir_path):
        return _run(recipe, force, allow_pickle)


def _run(recipe: Recipe, force: bool, allow_pickle: bool) -> tuple[dict[str, Any], bool]:
    started = time.perf_counter()
    p = plan(recipe, allow_pickle)
    for message in p.warnings:
        output.warn(message)
    inputs = fingerprint_inputs(recipe, p, allow_pickle)
    final = stage_path(recipe)
    from ..manifest import compute_fingerprint

    if not force:
        existing = up_to_date(final, compute_fingerprint(STAGE, inputs))
        if existing and _still_sealed(recipe, existing):
            output.log(f"convert: inputs unchanged, reusing {final} (--force to redo)")
            return existing, True
    if recipe.draft.init == "random":
        output.warn(
            "draft.init: random attaches an UNTRAINED head: acceptance will be ~0 and speculation slower than "
            "the baseline. Use it for plumbing tests only; give draft.model for a real head."
        )
    timings = {"plan_s": round(time.perf_counter() - started, 3)}
    check_replaceable(final)  # before training, not after an hour of it
    trained = _train(recipe, p, inputs["target_files"], timings) if recipe.draft.train is not None else None
    head = _draft_tensors(recipe, p, trained)  # dtype decided and casts checked before anything is written
    with stage_dir(final, STAGE, inputs, relative_paths=True) as staging:
        # The head first: the quantization check runs it on the fake-quantized target between
        # calibration and export (the export turns the model's weights into real FP8/INT4 in place).
        draft_section, checks = _write_draft(recipe, p, staging.path / "draft", timings, trained, head)
        extra = {}
        if trained is not None:
            extra["training"] = trained.manifest_section()
            extra["training"]["features"] = recipe.draft.train.features
            # On the source weights: a quantized export does not load back into transformers as it runs
            # (its FP8/INT4 weights would be read without their scales); for `none` they are the same bytes.
            extra["training"]["evaluation"] = _evaluate(recipe, p, p.target.path, staging.path / "draft", timings)
            extra["training"]["loss_plot"] = _loss_plot(trained, staging.path, final)
        check = None
        if recipe.quantize.format != "none" and recipe.quantize.eval_prompts:
            from . import quant_check

            reused = trained is not None and quant_check.same_settings(recipe) and extra["training"]["evaluation"] is not None
            # the unquantized pass first, so only one target is ever in memory
            unquantized = (extra["training"]["evaluation"] if reused else quant_check.measure_unquantized(
                recipe, p.target.path, staging.path / "draft", p.aux_layer_ids, _device(recipe), p.dtype, timings))

            def check(fake_quant: Any) -> dict[str, Any]:
                return quant_check.run(recipe, p.target.path, staging.path / "draft", staging.path, p.aux_layer_ids,
                                       fake_quant, _device(recipe), p.dtype, unquantized, reused, timings)

        target_section = _write_target(recipe, p, staging.path / "target", timings, check)
        manifest = staging.finish(
            artifacts={"target_dir": str(target_section.pop("dir")), "draft_dir": str(staging.path / "draft")},
            target=target_section,
            draft=draft_section,
            quantization=target_section.pop("quantization"),
            decisions={
                "aux_layer_ids": p.aux_layer_ids,
                "aux_layer_convention": "output",
                "aux_layer_source": p.aux_note,
                "draft_vocab_size": draft_section["draft_vocab_size"],
                "rope_export": draft_section["rope_export"],
                "export_dtype": draft_section["dtype"],
                "export_dtype_reason": head.dtype.reason,
                "casts": head.casts,
                # How the first draft layer normalises the target feature: `eagle3` = hidden_norm(h),
                # what TensorRT-LLM, vLLM, SGLang and EAGLE compute (Model Optimizer's training module
                # computes hidden_norm(input_layernorm(h)); see docs/reference_decoder.md).
                "draft_norm_layout": "eagle3",
            },
            checks=checks,
            warnings=p.warnings,
            timings=timings,
            # What later stages check (manifest.check_sealed). A copied target has the source's bytes, whose
            # digests the fingerprint already holds: sealing it reads nothing again.
            sealed={"convert/target": seal_tree(staging.path / "target",
                                                inputs["target_files"] if target_section["copy"] else None),
                    "convert/draft": seal_tree(staging.path / "draft")},
            **extra,
        )
        # training ran before the staging directory opened: count it in the stage's total
        manifest["timings"]["total_s"] = round(manifest["timings"]["total_s"] + timings.get("train_s", 0.0), 3)
    return staging.manifest, False



def _still_sealed(recipe: Recipe, existing: dict[str, Any]) -> bool:
    """Whether the folders the last convert sealed are as it left them (else convert runs again)."""
    try:
        check_sealed(recipe.workdir_path, existing, STAGE)
    except InputError as exc:
        output.warn(f"convert: {exc.message}; converting again")
        return False
    return True


def _loss_plot(trained: Any, staging: Path, final: Path) -> str | None:
    """training-loss.png beside the manifest: training against held-out loss, so memorising shows."""
    from ..training.plots import write_loss_plot

    written = write_loss_plot(trained.result.history, staging / "training-loss.png")
    return str(final / written.name) if written else None


def _train(recipe: Recipe, p: ConvertPlan, target_fingerprint: Any, timings: dict[str, float]):
    from ..training import distributed
    from ..training.data import fingerprint
    from ..training.pipeline import train_head

    t0 = time.perf_counter()
    trained = train_head(recipe, p.target.path, fingerprint(target_fingerprint), _device(recipe), p.dtype, p.aux_layer_ids)
    timings["train_s"] = round(time.perf_counter() - t0, 3)
    world = distributed.current()
    distributed.finish(world)
    if not world.main:
        # Data-parallel launch: every process holds the same head; process 0 exports it.
        raise SystemExit(0)
    return trained


def _evaluate(recipe: Recipe, p: ConvertPlan, target_dir: Path, draft_dir: Path, timings: dict[str, float]) -> dict[str, Any] | None:
    """tau of the trained head on held-out prompts: the chain of the build and a dynamic tree."""
    from ..training.data import load_prompt_samples
    from ..training.evaluate import measure
    from .quant_check import eval_shapes

    train = recipe.draft.train
    if not train.eval_prompts:
        return None
    shapes = eval_shapes(recipe)
    threads.apply_for_phase(recipe.runtime.threads, "evaluation")
    t0 = time.perf_counter()
    items = load_prompt_samples(train.eval_prompts, "draft.train.eval_prompts", recipe.base_dir)[: train.eval_samples]
    with output.progress() as bar:
        task = bar.add_task("measure acceptance (reference decoder, held-out prompts)", total=len(items) * (1 + len(shapes)))
        report = measure(Path(target_dir), draft_dir, p.aux_layer_ids, train.eval_prompts, items,
                         train.eval_max_new_tokens, shapes, device=_device(recipe), dtype=p.dtype,
                         on_prompt=lambda: bar.advance(task))
    timings["eval_s"] = round(time.perf_counter() - t0, 3)
    for name, entry in report["shapes"].items():
        output.check(entry["identical_to_plain"],
                     f"held-out {name}: tau {entry['acceptance_length']:.2f}, per position {entry['per_position_acceptance']}, "
                     f"{entry['tokens_per_second']:.1f} tok/s vs plain {report['baseline_tokens_per_second']:.1f} "
                     f"({entry['speedup_vs_plain']}x), output identical to plain: {entry['identical_to_plain']}")
    return report


# --------------------------------------------------------------------------- target


def _write_target(recipe: Recipe, p: ConvertPlan, out: Path, timings: dict[str, float],
                  check: Any = None) -> dict[str, Any]:
    """Copy or quantize the target; ``check(fake_quant_model)`` runs between calibration and export."""
    info = p.target_info
    section: dict[str, Any] = {
        "source": p.target.spec,
        "source_kind": p.target.kind,
        "source_path": str(p.target.path),
        "architecture": (p.target_config.get("architectures") or [None])[0],
        "model_type": p.target_config.get("model_type"),
        "num_hidden_layers": info.num_hidden_layers,
        "hidden_size": info.hidden_size,
        "vocab_size": info.vocab_size,
        "max_position_embeddings": info.max_position_embeddings,
        "dtype": p.dtype,
        "checkpoint_dtype": _checkpoint_dtype(p.target_config),
    }
    t0 = time.perf_counter()
    if recipe.quantize.format == "none":
        # Own copies (reflinks where the filesystem clones), never hard links: an edit or a chmod
        # under convert/target must not reach the user's checkpoint or the hub cache's blobs.
        copied = copy_tree(source_files(p.target.path, "target.model"), out)
        section["dir"] = out
        section["copy"] = copied
        section["quantization"] = {"format": "none", "kv_cache_quant_algo": None}
        how = ("cloned (copy-on-write reflinks)" if copied["method"] == "reflink"
               else f"copied ({copied['bytes'] / 1e6:.1f} MB in {copied['seconds']:.2f} s)")
        output.check(True, f"target {how} into convert/target; the source is never written")
    else:
        section["dir"] = out
        section["copy"] = None
        section["quantization"] = _quantize_target(recipe, p, out, timings, check)
    timings["target_s"] = round(time.perf_counter() - t0, 3)
    return section


def _load_target(recipe: Recipe, p: ConvertPlan, device: str, max_memory: dict[int, int] | None = None):
    """The target in ``p.dtype`` on ``device``; with ``max_memory``, spread over those GPUs by a device map."""
    torch = require("torch")
    transformers = require("transformers")
    with output.progress() as bar:
        task = bar.add_task("load target" + (f" over {len(max_memory)} GPUs" if max_memory else ""), total=1)
        kwargs = {"dtype": getattr(torch, p.dtype), "trust_remote_code": recipe.target.trust_remote_code}
        if max_memory:
            # Loaded straight onto the GPUs, layer by layer (never whole on one device); accelerate's hooks move
            # the activations from GPU to GPU during the calibration forwards.
            model = transformers.AutoModelForCausalLM.from_pretrained(
                str(p.target.path), device_map="auto", max_memory=max_memory, **kwargs)
        else:
            model = transformers.AutoModelForCausalLM.from_pretrained(str(p.target.path), **kwargs).to(device)
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(p.target.path), trust_remote_code=recipe.target.trust_remote_code)
        bar.advance(task)
    model.eval()
    if not getattr(model.config, "architectures", None):
        model.config.architectures = [type(model).__name__]
    return model, tokenizer


def calibration_max_memory(recipe: Recipe, p: ConvertPlan) -> dict[int, int] | None:
    """Where calibration puts the target (``models.size.calibration_placement``, what ``specconvert plan`` prints):
    None when it fits the first GPU (moved there whole), else ``max_memory`` for a device map over every
    visible GPU. Model Optimizer's own PTQ example loads big targets the same way (``device_map="auto"`` over the
    visible GPUs, ``examples/llm_ptq/example_utils.py`` ``get_model``, Model-Optimizer main as of 0.4x)."""
    from ..errors import EnvironmentMissing
    from ..models import size

    torch = require("torch")
    free = [int(torch.cuda.mem_get_info(i)[0]) for i in range(torch.cuda.device_count())]
    weights = size.weight_bytes(p.target_config, p.dtype) or 0
    act = size.forward_activation_bytes(p.target_config, recipe.quantize.calib_seq_len, size.dtype_bytes(p.dtype))
    gpus, per_gpu = size.calibration_placement(weights, act, free)
    if gpus <= 1 and (not free or per_gpu <= free[0]):
        return None
    if per_gpu > min(free):
        need = size.calibration_gpus_needed(weights, act, min(free))
        raise EnvironmentMissing(
            f"calibrating the target needs about {size.gib(per_gpu)} GiB per GPU over the {len(free)} visible GPU(s) "
            f"({size.gib(weights)} GiB of weights in {p.dtype}), and the smallest has {size.gib(min(free))} GiB free",
            fix=f"run convert where {need or 'more'} such GPUs are visible (`specconvert plan` shows the need), or "
                "start from a pre-quantized checkpoint with quantize.format: none")
    return size.calibration_max_memory(act, free)


def _quantize_target(recipe: Recipe, p: ConvertPlan, out: Path, timings: dict[str, float], check: Any = None) -> dict[str, Any]:
    """Calibrate, run ``check`` on the fake-quantized model (the acceptance check), export."""
    from ..backends.modelopt import quantize as mq

    torch = require("torch")
    q = recipe.quantize
    device = _device(recipe)
    model, tokenizer = _load_target(recipe, p, device, calibration_max_memory(recipe, p) if device == "cuda" else None)
    t0 = time.perf_counter()
    with output.progress() as bar:
        task = bar.add_task(f"calibrate {q.format}", total=q.calib_samples)
        mq.calibrate(model, tokenizer, q, recipe.base_dir, on_batch=lambda: bar.advance(task))
    timings["calibrate_s"] = round(time.perf_counter() - t0, 3)
    acceptance = check(model) if check else None
    t0 = time.perf_counter()
    with output.progress() as bar:
        task = bar.add_task("export quantized target", total=1)
        section = mq.export(model, out, getattr(torch, p.dtype))
        save_tokenizer(tokenizer, out)
        bar.advance(task)
    for extra in ("generation_config.json",):
        if (p.target.path / extra).is_file() and not (out / extra).is_file():
            shutil.copy2(p.target.path / extra, out / extra)
    timings["export_target_s"] = round(time.perf_counter() - t0, 3)
    output.check(True, f"target quantized to {q.format}: hf_quant_config.json {section}")
    del model
    return {
        "format": q.format,
        "quant_algo": section.get("quant_algo"),
        "kv_cache_quant_algo": section.get("kv_cache_quant_algo"),
        "exclude_modules": section.get("exclude_modules", []),
        "calib_samples": q.calib_samples,
        "acceptance": acceptance,
    }


# --------------------------------------------------------------------------- draft


def _skeleton(recipe: Recipe, p: ConvertPlan):
    """The target's module tree without weights (meta device): enough to attach and export a head."""
    torch = require("torch")
    transformers = require("transformers")
    accelerate = require("accelerate")
    config = transformers.AutoConfig.from_pretrained(str(p.target.path), trust_remote_code=recipe.target.trust_remote_code)
    if not getattr(config, "architectures", None):
        config.architectures = [p.target_config.get("architectures", [None])[0] or "LlamaForCausalLM"]
    with accelerate.init_empty_weights():
        model = transformers.AutoModelForCausalLM.from_config(
            config, dtype=getattr(torch, p.dtype), trust_remote_code=recipe.target.trust_remote_code
        )
    model.config.architectures = config.architectures
    return model


def _draft_tensors(recipe: Recipe, p: ConvertPlan, trained: Any = None):
    """The head's tensors in the export dtype (``draft.export_dtype``), casts checked and recorded."""
    from ..heads.dtype import prepare_for_export

    if p.head is not None:
        source, origin = p.head.tensors, "imported"
    elif trained is not None:
        source, origin = trained.tensors, "trained"
    else:
        source, origin = None, "random"
    head = prepare_for_export(source, recipe.draft.export_dtype, origin, p.dtype)
    if head.casts:
        output.log(f"draft: {len(head.casts)} tensor(s) cast {head.dtype.source_dtype} -> {head.dtype.dtype} "
                   f"({sum(c['rounded'] for c in head.casts)} value(s) rounded): {head.dtype.reason}")
    return head


def _write_draft(recipe: Recipe, p: ConvertPlan, out: Path, timings: dict[str, float], trained: Any = None,
                 head: Any = None) -> tuple[dict[str, Any], list[dict]]:
    from ..backends.modelopt import eagle

    torch = require("torch")
    t0 = time.perf_counter()
    head = head or _draft_tensors(recipe, p, trained)
    export_dtype = getattr(torch, head.dtype.dtype)
    model = _skeleton(recipe, p)
    if p.head is not None:
        arch = _arch_from_head(p.head.arch)
    elif trained is not None:
        arch = trained.arch
    else:
        arch = eagle.EagleArch.for_target(model.config, recipe.draft.draft_vocab_size, recipe.draft.num_layers)
    with output.progress() as bar:
        task = bar.add_task("attach EAGLE-3 head (Model Optimizer)", total=3)
        eagle.attach_eagle(model, arch, p.aux_layer_ids)
        bar.advance(task)
        drop_lm_head = False
        if head.tensors is not None:
            drop_lm_head = "lm_head.weight" not in head.tensors
            if drop_lm_head:
                # Model Optimizer's exporter copies the target's lm_head when the head has none;
                # the canonical layout leaves it out (runtimes take the target's).
                model.lm_head.to_empty(device="cpu")
            eagle.load_head(model, head.tensors)
        else:
            _random_init(model, seed=0, dtype=export_dtype)
        bar.advance(task)
        rope = _rope_for_export(p)
        eagle.export_draft(model, out, export_dtype, rope["config"])
        if drop_lm_head:
            _drop_tensor(out / "model.safetensors", "lm_head.weight")
        bar.advance(task)
    timings["draft_s"] = round(time.perf_counter() - t0, 3)
    # like with like: the source as cast (and checked) for export, so any other change shows
    checks = verify_draft(out, p, expect=head.tensors, casts=head.casts)
    config = json.loads((out / "config.json").read_text())
    section = {
        "source": p.head_source.spec if p.head_source else None,
        "source_path": str(p.head_source.path) if p.head_source else None,
        "layout": p.head_layout,
        "init": recipe.draft.init,
        "trained": p.head is not None or trained is not None,
        "trained_here": trained is not None,
        "draft_vocab_size": config.get("draft_vocab_size") or config.get("vocab_size"),
        "num_hidden_layers": config.get("num_hidden_layers"),
        "max_position_embeddings": config.get("max_position_embeddings"),
        "rope_theta": config.get("rope_theta"),
        "rope_scaling": config.get("rope_scaling"),
        "rope_export": rope["choice"],
        "dtype": head.dtype.dtype,
        "source_dtype": head.dtype.source_dtype,
        "has_lm_head": "lm_head.weight" in _tensor_names(out / "model.safetensors"),
    }
    return section, checks


def _arch_from_head(a: Any):
    from ..backends.modelopt.eagle import EagleArch

    return EagleArch(
        intermediate_size=a.intermediate_size,
        num_attention_heads=a.num_attention_heads,
        num_key_value_heads=a.num_key_value_heads,
        head_dim=a.head_dim,
        num_hidden_layers=a.num_layers,
        rms_norm_eps=a.rms_norm_eps,
        rope_theta=a.rope_theta,
        rope_scaling=a.rope_scaling,
        hidden_act=a.hidden_act,
        attention_bias=a.attention_bias,
        mlp_bias=a.mlp_bias,
        draft_vocab_size=a.draft_vocab_size,
        has_lm_head=a.has_lm_head,
    )


def _rope_for_export(p: ConvertPlan) -> dict[str, Any]:
    """Rope settings the exported config states: the ones the head computes with.

    Model Optimizer's export writes YaRN x32 by default, meant for heads it trained
    with that scaling in mind; an imported head keeps its source settings, a new head
    the plain rope it was built with (recorded as the decision).
    """
    if p.head is not None:
        theta, scaling = p.head.arch.rope_theta, p.head.arch.rope_scaling
        choice = "source"
    else:
        theta, scaling = p.target_info.rope_theta or 10000.0, None
        choice = "plain (no scaling): head built here"
    return {"config": {"rope_theta": theta, "rope_scaling": scaling}, "choice": choice}


def _random_init(model: Any, seed: int, dtype: Any) -> None:
    """Seeded init of a fresh head (the module was created on the meta device), built in ``dtype``."""
    torch = require("torch")
    module = model.eagle_module
    module.to_empty(device="cpu")
    module.to(dtype)
    generator = torch.Generator().manual_seed(seed)
    std = getattr(model.config, "initializer_range", 0.02) or 0.02
    with torch.no_grad():
        for name, tensor in module.state_dict(keep_vars=True).items():
            if name.endswith("d2t"):
                tensor.zero_()
            elif name.endswith("inv_freq"):
                continue
            elif tensor.dim() == 1:
                tensor.fill_(1.0)
            else:
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * std)


def _tensor_names(path: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        return list(fh.keys())


def _drop_tensor(path: Path, name: str) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(path))
    state.pop(name, None)
    save_file(state, str(path))


def verify_draft(out: Path, p: ConvertPlan, expect: dict[str, Any] | None, casts: list[dict] | None = None) -> list[dict]:
    """Read the exported head back: layout, config facts, and exact tensor equality (dtype included) with
    ``expect``, the source tensors as cast for export (``casts`` lists which were cast)."""
    from safetensors.torch import load_file

    torch = require("torch")
    checks: list[dict] = []

    def record(name: str, ok: bool, detail: str) -> None:
        checks.append({"check": name, "ok": ok, "detail": detail})
        output.check(ok, f"{name}: {detail}")

    exported = load_file(str(out / "model.safetensors"))
    config = json.loads((out / "config.json").read_text())
    required = {"fc.weight", "norm.weight", "layers.0.hidden_norm.weight", "layers.0.input_layernorm.weight", "layers.0.self_attn.q_proj.weight"}
    missing = sorted(required - set(exported))
    record("canonical layout", not missing, "all required tensors present" if not missing else f"missing {missing}")
    aux = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    record("aux layers recorded", aux == p.aux_layer_ids, f"eagle_config.eagle_aux_hidden_state_layer_ids = {aux}")
    fc_in = exported["fc.weight"].shape[1] if "fc.weight" in exported else None
    want = len(p.aux_layer_ids) * p.target_info.hidden_size
    record("fc input = n_aux x target hidden", fc_in == want, f"{fc_in} == {want}")
    if "d2t" in exported:
        d2t = exported["d2t"]
        targets = torch.arange(d2t.numel()) + d2t
        ok = bool(((targets >= 0) & (targets < p.target_info.vocab_size)).all()) and targets.unique().numel() == d2t.numel()
        record("d2t in range and injective", ok, f"{d2t.numel()} draft ids -> target vocab {p.target_info.vocab_size}")
    if expect is not None:
        # torch.equal compares values across dtypes: check the dtype too, or a stray cast passes
        mismatched = [
            name
            for name, value in expect.items()
            if name in exported and (exported[name].dtype != value.dtype or not torch.equal(exported[name], value))
        ]
        absent = sorted(set(expect) - set(exported))
        extra = sorted(set(exported) - set(expect))
        ok = not mismatched and not absent and not extra
        cast_note = ""
        if casts:
            pairs = sorted({f"{c['from']} -> {c['to']}" for c in casts})
            cast_note = f" ({len(casts)} cast {', '.join(pairs)}: compared with the source cast the same way)"
        detail = (
            f"{len(expect)} tensors identical to the source after renaming{cast_note}"
            if ok
            else f"differs: {mismatched[:4]} missing: {absent[:4]} extra: {extra[:4]}"
        )
        record("lossless import", ok, detail)
    failed = [c for c in checks if not c["ok"]]
    if failed:
        from ..errors import CheckFailed

        raise CheckFailed(f"exported head failed {len(failed)} check(s): {failed[0]['check']}: {failed[0]['detail']}")
    return checks
