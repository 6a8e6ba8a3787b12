"""The `build` stage: convert/ + recipe `build`/`runtime` -> <workdir>/engine/, the deployment bundle.

Order of work: read and check the convert manifest, pick the TensorRT-LLM version
and its spellings, apply the EAGLE-3 combination rules, generate every option
(checked against that version's option names) — all before anything is written;
then write the bundle into a staging directory, optionally load and warm it
(TensorRT-LLM or the reference decoder), and seal it with the manifest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .. import output
from .._imports import installed_version
from ..backends import launch
from ..backends.trtllm import loader, options as trt_options, rules, versions
from ..backends.vllm import launch as vllm_launch
from ..errors import InputError
from ..manifest import compute_fingerprint, manifest_hash, stage_dir, up_to_date
from ..workdir import workdir_lock
from .outputs import engine_dir, read_convert, tuned_measurement

STAGE = "build"


@dataclass
class BuildResult:
    manifest: dict[str, Any]
    skipped: bool  # inputs unchanged: the existing bundle was kept


def plan(recipe: Any, convert: dict[str, Any] | None, tuned: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything build decides, without writing: version, rules, options. Raises on a bad combination.

    ``tuned`` holds each engine's form of the tune result (see :func:`tuned_forms`): TensorRT-LLM then
    gets the measured ``max_draft_len`` and ``draft_len_schedule``, or no speculation at all.
    """
    target = versions.resolve(recipe.runtime.trtllm_version)
    report = rules.check(recipe, convert, target)
    if report.errors:
        more = f" (and {len(report.errors) - 1} more)" if len(report.errors) > 1 else ""
        raise InputError(report.errors[0] + more, problems=report.errors)
    result: dict[str, Any] = {"target": target, "report": report}
    if convert is not None:
        artifacts = convert["artifacts"]
        aux = convert["decisions"]["aux_layer_ids"]
        build = recipe.build
        trt_tuned = (tuned or {}).get("trtllm")
        spec = None
        if trt_tuned is not None and trt_tuned.get("method") == "ngram":  # tune measured n-gram best everywhere
            from types import SimpleNamespace

            spec = trt_options.ngram_speculative_config(target, int(trt_tuned["max_draft_len"]),
                                                        SimpleNamespace(prompt_lookup_max=trt_tuned["prompt_lookup_max"]))
        elif trt_tuned is None or trt_tuned["speculate"]:
            if trt_tuned is not None:
                build = build.model_copy(update={"max_draft_len": int(trt_tuned["max_draft_len"])})
            spec = trt_options.speculative_config(target, build, artifacts["draft_dir"], aux, report)
            if trt_tuned is not None and trt_tuned.get("draft_len_schedule"):
                spec["draft_len_schedule"] = {int(k): int(v) for k, v in trt_tuned["draft_len_schedule"].items()}
        result["options"] = trt_options.llm_api_options(target, build, report, spec)
        result["baseline"] = trt_options.llm_api_options(target, build, report, None)
    return result


def tuned_forms(recipe: Any, convert: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None, str]:
    """Each engine's schedule, derived here from what `specconvert tune` measured on this convert, for this
    build's settings: the TensorRT-LLM version it builds for, ``tune.trtllm_allow_zero``, ``build.max_batch_size``
    and ``tune.margin`` (the choice is made again). Returns (forms, decision, note); (None, None, why) untuned."""
    from ..tuning import forms

    measured, note = tuned_measurement(recipe, convert)
    if measured is None:
        return None, None, note
    decision = forms.decide(measured, recipe.tune.margin, recipe.bench.baselines)
    target = versions.resolve(recipe.runtime.trtllm_version)
    engines = forms.engine_forms(decision, target.version, recipe.build.max_batch_size, recipe.tune.trtllm_allow_zero)
    return engines, {"margin": recipe.tune.margin, **decision.as_dict()}, note


def trtllm_drafting(report: rules.RuleReport, recipe: Any, tuned: dict[str, Any] | None) -> str:
    """What TensorRT-LLM drafts with these options, in words (the manifest's ``decisions.trtllm_drafting``)."""
    if report.trtllm_tree:
        return "dynamic_tree"
    form = (tuned or {}).get("trtllm")
    if form is None:
        return f"chain of {recipe.build.max_draft_len}"
    if form.get("method") == "ngram":
        return (f"NGram: up to {form['max_draft_len']} tokens by prompt lookup, no head (specconvert tune measured it "
                "best at every concurrency)")
    if not form["speculate"]:
        return "none: speculation does not pay at batch size 1 (specconvert tune)"
    schedule = form.get("draft_len_schedule")
    if not schedule:
        return f"chain of {form['max_draft_len']}"
    return (f"chain of {form['max_draft_len']} at batch size 1, then by draft_len_schedule {schedule} "
            f"(keys: batch-size {form['draft_len_schedule_keys'].replace('_', ' ')}s)")


def _yaml(options: dict[str, Any], header: list[str]) -> str:
    return "".join(f"# {line}\n" for line in header) + yaml.safe_dump(options, sort_keys=False)


def run(recipe: Any, force: bool = False, load: bool = True, verify: bool = False) -> BuildResult:
    """Build (or keep, when unchanged) ``<workdir>/engine/``; return its manifest. ``verify``: hash every sealed file."""
    # Locked from the read of convert/ on, so a concurrent convert cannot swap it mid-build.
    with workdir_lock(recipe.workdir_path):
        return _run(recipe, force, load, verify)


def _run(recipe: Any, force: bool, load: bool, verify: bool = False) -> BuildResult:
    convert = read_convert(recipe, verify=verify)
    tuned, tune_decision, tune_note = tuned_forms(recipe, convert)
    decided = plan(recipe, convert, tuned)
    target: versions.TargetVersion = decided["target"]
    report: rules.RuleReport = decided["report"]
    final = engine_dir(recipe)
    # the device the vLLM launch lines are written for; build itself needs none (a CI runner writes a GPU bundle)
    vllm_values = vllm_launch.launch_values(recipe.runtime)
    inputs = {
        "recipe": recipe.section("build", "runtime"),
        "vllm_launch": vllm_values.as_dict(),
        "convert_manifest": manifest_hash(convert),
        "tuned": tuned,
        "tune_decision": tune_decision,
        "tensorrt_llm_installed": installed_version("tensorrt_llm"),
        "load": load,
    }
    if recipe.bench.baselines:  # the free-speculation launches build writes (absent: the fingerprint of old bundles)
        inputs["free_speculation"] = [list(recipe.bench.baselines), recipe.bench.ngram.model_dump()]
    if not force:
        existing = up_to_date(final, compute_fingerprint(STAGE, inputs))
        if existing is not None:
            output.log(f"build: {final} is up to date (use --force to rebuild)")
            return BuildResult(existing, skipped=True)

    warnings = list(target.warnings) + list(report.warnings) + vllm_launch.context_length_warnings(recipe.build,
                                                                                                     recipe.runtime)
    for message in warnings:
        output.warn(message)
    for engine, form in (tuned or {}).items():
        for note in form.get("notes") or []:
            output.log(f"build: {engine} schedule: {note}")

    artifacts_in = convert["artifacts"]
    target_dir, draft_dir = str(artifacts_in["target_dir"]), str(artifacts_in["draft_dir"])
    aux = [int(i) for i in convert["decisions"]["aux_layer_ids"]]
    title = f"{recipe.name}: target {target_dir}, draft {draft_dir}"

    with stage_dir(final, STAGE, inputs) as stage:
        root = stage.path
        trt = root / "trtllm"
        trt.mkdir()
        header = [
            f"TensorRT-LLM {target.version} ({target.spelling.family}.x spellings, source: {target.source}) "
            "LLM-API options, generated by `specconvert build`.",
            "Use: trtllm-serve MODEL --extra_llm_api_options THIS_FILE (see serve.sh).",
        ]
        (trt / "llm_api_options.yaml").write_text(_yaml(decided["options"], header), encoding="utf-8")
        (trt / "baseline.yaml").write_text(
            _yaml(decided["baseline"], header + ["Baseline: the same settings without speculative decoding."]),
            encoding="utf-8",
        )
        launch.write_executable(trt / "serve.sh", launch.trtllm_serve(target_dir, recipe.build, recipe.runtime, title))
        launch.write_executable(trt / "bench.sh", launch.trtllm_bench(target_dir, title))
        (trt / "dataset.jsonl").write_text(launch.bench_dataset(), encoding="utf-8")

        overlays = {}
        for engine, update in (("vllm", launch.vllm_overlay_update(aux)), ("sglang", launch.sglang_overlay_update(aux))):
            overlays[engine] = launch.write_draft_overlay(Path(draft_dir), root / engine / "draft", update)
        launch.write_executable(root / "vllm" / "serve.sh",
                                launch.vllm_serve(target_dir, str(final / "vllm" / "draft"), recipe.build, recipe.runtime, title,
                                                  name=recipe.name, tuned=(tuned or {}).get("vllm"), values=vllm_values))
        launch.write_executable(root / "vllm" / "serve-baseline.sh",
                                launch.vllm_serve_baseline(target_dir, recipe.build, recipe.runtime, title, recipe.name,
                                                           values=vllm_values))
        launch.write_executable(root / "sglang" / "serve.sh",
                                launch.sglang_serve(target_dir, str(final / "sglang" / "draft"), recipe.build, recipe.runtime,
                                                    title, tuned=(tuned or {}).get("sglang")))

        free = _write_free_speculation(recipe, root, target, decided["baseline"], target_dir, title)

        reference_settings = {
            "target_dir": target_dir,
            "draft_dir": draft_dir,
            "aux_layer_ids": aux,
            "max_draft_len": recipe.build.max_draft_len,
            "speculative": True,
            "tree": recipe.build.tree.model_dump() if recipe.build.tree else None,
            "device": recipe.runtime.device,
            "dtype": (convert.get("target") or {}).get("dtype"),
            "temperature": recipe.build.temperature,
            "draft_vocab_size": (convert.get("decisions") or {}).get("draft_vocab_size"),
        }
        ref_tuned = (tuned or {}).get("reference")
        if ref_tuned is not None:
            # The reference server decodes one request at a time: batch 1's measured choice.
            reference_settings["speculative"] = bool(ref_tuned["speculate"])
            if ref_tuned["speculate"]:
                reference_settings["max_draft_len"] = int(ref_tuned["max_draft_len"])
        (root / "reference").mkdir()
        (root / "reference" / "settings.json").write_text(json.dumps(reference_settings, indent=2) + "\n")

        load_info = _load(recipe, convert, decided, target, load, reference_settings)
        for message in load_info.pop("warnings", []):
            warnings.append(message)
            output.warn(message)

        decisions = {
            **target.as_dict(),
            "aux_layer_ids": aux,
            "aux_layer_convention": "output of layer i (TensorRT-LLM eagle3_layers_to_capture)",
            "vllm_aux_layer_ids": launch.vllm_config_aux_ids(aux),
            "vllm_launch": vllm_values.as_dict(),
            "sglang_config_aux_layer_ids": launch.sglang_config_aux_ids(aux),
            "sglang_captured_layers": launch.sglang_captured_layers(launch.sglang_config_aux_ids(aux)),
            "aux_layer_numbering": launch.aux_layer_numbering(aux),
            "tune": tune_note,
            "tuned": tuned,
            "tune_decision": tune_decision,
            "draft_vocab_size": (convert.get("decisions") or {}).get("draft_vocab_size"),
            "trtllm_drafting": trtllm_drafting(report, recipe, tuned),
            # what the bundle's launches speculate with: the head, or n-gram where tune measured it best everywhere
            "speculation": ((tune_decision or {}).get("served") or "eagle3"),
            "sglang_shape": launch.chain_or_tree(recipe.build),
            "fixes": report.fixes,
            "keys_written": {
                "trtllm/llm_api_options.yaml": trt_options.flatten_keys(decided["options"]),
                "trtllm/baseline.yaml": trt_options.flatten_keys(decided["baseline"]),
            },
            "option_names_file": f"specconvert/data/trtllm/options/{target.spelling.family}.json",
            "option_names_sources": [
                url for src in trt_options.option_names(target.spelling.family)["source"] for url in src.get("urls", [])
            ],
        }
        artifacts = {
            "bundle": str(root),
            "target_dir": target_dir,
            "draft_dir": draft_dir,
            "trtllm_options": str(trt / "llm_api_options.yaml"),
            "trtllm_baseline": str(trt / "baseline.yaml"),
            "trtllm_serve": str(trt / "serve.sh"),
            "trtllm_bench": str(trt / "bench.sh"),
            "trtllm_dataset": str(trt / "dataset.jsonl"),
            "vllm_serve": str(root / "vllm" / "serve.sh"),
            "vllm_serve_baseline": str(root / "vllm" / "serve-baseline.sh"),
            "sglang_serve": str(root / "sglang" / "serve.sh"),
            "vllm_draft": str(root / "vllm" / "draft"),
            "sglang_draft": str(root / "sglang" / "draft"),
            "draft_overlay_files": overlays,
            "reference_settings": str(root / "reference" / "settings.json"),
            **free,
        }
        timings = {"load_s": load_info.get("load_s")} if load_info.get("load_s") is not None else {}
        stage.finish(
            recipe=recipe.name,
            backend=recipe.runtime.backend,
            artifacts=artifacts,
            decisions=decisions,
            warnings=warnings,
            loaded=bool(load_info.get("loaded")),
            load_skipped_reason=load_info.get("load_skipped_reason"),
            load=load_info,
            timings=timings,
        )
    return BuildResult(stage.manifest, skipped=False)


def _write_free_speculation(recipe: Any, root: Path, target: Any, baseline: dict[str, Any], target_dir: str,
                            title: str) -> dict[str, str]:
    """`bench.baselines`' n-gram arm in each engine's own launch (no head): ``trtllm/ngram.yaml`` (the baseline's
    options plus ``NGram`` decoding), ``vllm/serve-ngram.sh`` and ``sglang/serve-ngram.sh``; suffix decoding is
    vLLM's alone (bench starts it from the argv). Returns the artifacts written."""
    from ..backends.sglang.launch import ngram_serve_script

    if "ngram" not in recipe.bench.baselines:
        return {}
    ngram = recipe.bench.ngram
    k = vllm_launch.free_draft_len(recipe.build, ngram)
    options = trt_options.ngram_options(baseline, target, k, ngram)
    (root / "trtllm" / "ngram.yaml").write_text(
        _yaml(options, [f"TensorRT-LLM {target.version} LLM-API options with NGram speculation (no head), generated "
                        "by `specconvert build` for bench.baselines.", "Use: OPTIONS=ngram.yaml engine/trtllm/serve.sh"]),
        encoding="utf-8")
    launch.write_executable(root / "vllm" / "serve-ngram.sh",
                            vllm_launch.free_serve_script(target_dir, recipe.build, recipe.runtime, recipe.name, title,
                                                          "ngram", ngram, vllm_launch.launch_values(recipe.runtime)))
    launch.write_executable(root / "sglang" / "serve-ngram.sh",
                            ngram_serve_script(target_dir, recipe.build, recipe.runtime, title, k, ngram))
    return {"trtllm_ngram": str(root / "trtllm" / "ngram.yaml"), "vllm_serve_ngram": str(root / "vllm" / "serve-ngram.sh"),
            "sglang_serve_ngram": str(root / "sglang" / "serve-ngram.sh")}


def _load(recipe, convert, decided, target, load: bool, reference_settings) -> dict[str, Any]:
    """Load + warm the bundle in the recipe's backend, or say exactly why not."""
    backend = recipe.runtime.backend
    if not load:
        return {"loaded": False, "backend": backend, "load_skipped_reason": "--no-load"}
    if backend == "trtllm":
        reason = loader.skip_reason()
        if reason:
            return {"loaded": False, "backend": backend, "load_skipped_reason": reason}
        output.log(f"build: loading target + EAGLE-3 head in TensorRT-LLM {target.version}")
        return loader.load_and_warm(
            convert["artifacts"]["target_dir"],
            decided["options"],
            target.spelling.config_class,
            recipe.build.warmup_tokens,
        )
    return _load_reference(recipe, convert, reference_settings)


def _reference_device(requested: str) -> str:
    if requested != "auto":
        return requested
    ok, _ = loader.cuda_available()
    return "cuda" if ok else "cpu"


def _load_reference(recipe, convert, settings) -> dict[str, Any]:
    import time

    try:
        from ..reference import DecodeSettings, ReferenceDecoder
    except ImportError as exc:
        # Only a missing reference module is an expected absence; a dependency failing inside it is not.
        if getattr(exc, "name", None) != "specconvert.reference":
            raise
        return {
            "loaded": False,
            "backend": "reference",
            "load_skipped_reason": f"specconvert.reference not available in this installation ({exc})",
        }
    device = _reference_device(recipe.runtime.device)
    if device == "cuda" and not loader.cuda_available()[0]:
        # the bundle is written for the GPUs it will run on; loading it is where a GPU is needed, not writing it
        return {"loaded": False, "backend": "reference",
                "load_skipped_reason": "runtime.device: cuda, and no CUDA device is visible here: the bundle is "
                                       "written; load it where it runs (`specconvert serve-test`)"}
    dtype = settings["dtype"]
    output.log(f"build: loading the reference EAGLE-3 decoder on {device}")
    started = time.perf_counter()
    decoder = ReferenceDecoder.from_convert_manifest(convert, device=device, dtype=dtype)
    load_s = time.perf_counter() - started
    tokenizer = getattr(decoder, "tokenizer", None)
    if tokenizer is not None:
        prompt, prompt_ids = loader.WARMUP_PROMPTS[0], list(tokenizer.encode(loader.WARMUP_PROMPTS[0]))
    else:  # a target folder without tokenizer files: warm up on fixed token ids
        prompt, prompt_ids = None, list(range(1, 9))
    # the bundle's own settings: a tuned bundle's draft length, or no speculation where tune turned it off
    result = decoder.generate(
        prompt_ids,
        recipe.build.warmup_tokens,
        DecodeSettings(max_draft_len=max(int(settings["max_draft_len"]), 1), tree=settings["tree"], temperature=0.0,
                       speculative=bool(settings["speculative"])),
    )
    info = {
        "loaded": True,
        "backend": "reference",
        "device": device,
        "dtype": dtype,
        "load_s": round(load_s, 3),
        "warmup": {
            "prompt": prompt if prompt is not None else f"token ids {prompt_ids} (no tokenizer)",
            "new_tokens": len(result.token_ids),
            "acceptance_length": result.acceptance_length,
            "tokens_per_second": result.tokens_per_second,
        },
    }
    if settings["speculative"] and result.acceptance_length is not None and result.acceptance_length <= 1.0:
        info["warnings"] = [
            f"reference warm-up acceptance length {result.acceptance_length}: the head proposes nothing the target "
            "accepts (an untrained head?)"
        ]
    return info
