"""`specconvert tune`: measure, then choose the draft length per concurrency for every engine."""

from __future__ import annotations

from ._options import Command, ForceOpt, JsonOpt, QuietOpt, RecipeArg, SetOpt, VerifyOpt, exit_codes, recipe_file, start


def tune(
    recipe: RecipeArg,
    set_: SetOpt = None,
    force: ForceOpt = False,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
    verify: VerifyOpt = False,
) -> None:
    """Measure acceptance and step costs per draft length -> <workdir>/tune/; `build` writes the chosen schedules."""
    from .. import output
    from ..stages import tune as tune_stage

    loaded = start(recipe, set_, json_out, quiet)
    from .serve_cmd import apply_threads

    apply_threads(loaded.runtime.threads)  # torch's per-core default crawls on a loaded shared CPU
    result = tune_stage.run(loaded, force=force, recipe_path=recipe_file(recipe), verify=verify)
    manifest = result.manifest
    if json_out:
        output.emit_json("tune", {"skipped": result.skipped, "tune_dir": str(tune_stage.tune_dir(loaded)), "manifest": manifest})
        return
    rows = [("tune", str(tune_stage.tune_dir(loaded)) + ("  (up to date, skipped)" if result.skipped else "")),
            ("per-position acceptance", manifest.get("per_position_acceptance")),
            ("draft length per concurrency", manifest.get("choice"))]
    if manifest.get("vllm_choice"):
        rows.append(("vLLM, its scheduled 0 priced", manifest["vllm_choice"]))
    rows.append(("engine schedules", "written by `specconvert build` for its TensorRT-LLM version and settings "
                 "(preview: report.md)"))
    rows += [("verdict", line) for line in manifest.get("verdict") or []]
    output.print_table("specconvert tune", rows)


EXIT_CODES = exit_codes(one="a check failed", four="a server tune started failed (vLLM)")


def register(app) -> None:
    app.command("tune", epilog=EXIT_CODES, cls=Command)(tune)
