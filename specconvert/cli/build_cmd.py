"""`specconvert build` and `specconvert doctor`."""

from __future__ import annotations

from typing import Optional

import typer
from typing_extensions import Annotated

from ._options import Command, ForceOpt, JsonOpt, QuietOpt, RecipeArg, SetOpt, VerifyOpt, exit_codes, start

NoLoadOpt = Annotated[
    bool, typer.Option("--no-load", help="Write the bundle without loading and warming it in the backend.")
]


def build(
    recipe: RecipeArg,
    set_: SetOpt = None,
    force: ForceOpt = False,
    no_load: NoLoadOpt = False,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
    verify: VerifyOpt = False,
) -> None:
    """Write <workdir>/engine/: TensorRT-LLM options + launch scripts (also vLLM, SGLang, reference), then load and warm it."""
    from .. import output
    from ..stages import build as build_stage

    loaded = start(recipe, set_, json_out, quiet)
    result = build_stage.run(loaded, force=force, load=not no_load, verify=verify)
    manifest = result.manifest
    if json_out:
        output.emit_json("build", {"skipped": result.skipped, "engine_dir": str(build_stage.engine_dir(loaded)), "manifest": manifest})
        return
    decisions = manifest.get("decisions", {})
    load = manifest.get("load") or {}
    warm = load.get("warmup") or {}
    rows = [
        ("bundle", str(build_stage.engine_dir(loaded)) + ("  (up to date, skipped)" if result.skipped else "")),
        ("TensorRT-LLM spellings", f"{decisions.get('trtllm_version')} ({decisions.get('trtllm_version_source')}) -> "
         f"{decisions.get('spelling_family')}.x, decoding_type {decisions.get('decoding_type')}"),
        ("aux layers", f"{decisions.get('aux_layer_ids')} (TRT-LLM, SGLang config) / "
         f"{decisions.get('vllm_aux_layer_ids')} (vLLM config)"),
        ("TRT-LLM drafting", decisions.get("trtllm_drafting")),
        ("loaded", "yes" if manifest.get("loaded") else f"no: {manifest.get('load_skipped_reason')}"),
    ]
    if manifest.get("loaded"):
        rows.append(("warm-up", f"acceptance length {warm.get('acceptance_length')}, {warm.get('tokens_per_second')} tok/s, "
                     f"load {load.get('load_s')} s"))
    rows.append(("warnings", len(manifest.get("warnings") or [])))
    output.print_table("specconvert build", rows)


def doctor(
    recipe: Annotated[Optional[str], typer.Argument(help="Recipe YAML or shipped recipe name to check (optional).",
                                                    metavar="RECIPE", show_default=False)] = None,
    set_: SetOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Check GPU, driver, library versions, disk and the recipe's EAGLE-3 feature combination."""
    from .. import output
    from ..doctor import run
    from ..errors import EnvironmentMissing, InputError

    output.set_mode(json_mode=json_out, quiet=json_out)
    loaded = start(recipe, set_, json_out) if recipe is not None else None
    report = run(loaded)
    if json_out:
        output.emit_json("doctor", report.as_dict())
    else:
        marks = {"ok": "✓", "warn": "!", "fail": "✗", "missing": "✗", "info": "·"}
        output.print_table("specconvert doctor", [(f"{marks[c.status]} {c.name}", c.detail) for c in report.checks])
    if report.exit_code == 2:
        raise InputError(report.reason or "the recipe is invalid", fix=report.fix)
    if report.exit_code == 3:
        raise EnvironmentMissing(report.reason or "environment missing", fix=report.fix)


EXIT_CODES = exit_codes(one="a check failed: an option the TensorRT-LLM version does not accept, or the "
                        "loaded bundle's warm-up", four="the backend failed to load the bundle")


def register(app: typer.Typer) -> None:
    app.command("build", epilog=EXIT_CODES, cls=Command)(build)


def register_doctor(app: typer.Typer) -> None:
    app.command("doctor", cls=Command)(doctor)
