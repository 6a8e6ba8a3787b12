"""`specconvert convert RECIPE`."""

from __future__ import annotations

import typer
from typing_extensions import Annotated

from ._options import Command, ForceOpt, JsonOpt, QuietOpt, RecipeArg, SetOpt, exit_codes, start

AllowPickleOpt = Annotated[
    bool,
    typer.Option("--allow-pickle", help="Accept pickle weights (.bin/.pt); loaded with torch.load(weights_only=True)."),
]


def convert(
    recipe: RecipeArg,
    set_: SetOpt = None,
    force: ForceOpt = False,
    allow_pickle: AllowPickleOpt = False,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Attach/import an EAGLE-3 head with Model Optimizer, optionally quantize, export the canonical pair."""
    import os

    from .. import output
    from ..stages import convert as stage

    rank = int(os.environ.get("RANK", "0") or 0)
    loaded = start(recipe, set_, json_out and rank == 0, quiet or rank != 0)
    from .serve_cmd import apply_threads

    apply_threads(loaded.runtime.threads)  # torch's per-core default crawls on a loaded shared CPU
    train = loaded.draft.train
    if train is not None and train.num_processes > 1 and "WORLD_SIZE" not in os.environ:
        args = [str(recipe)] + [x for value in (set_ or []) for x in ("--set", value)]
        args += [flag for flag, on in (("--force", force), ("--allow-pickle", allow_pickle), ("--json", json_out), ("--quiet", quiet)) if on]
        raise typer.Exit(_relaunch(train.num_processes, args))
    with output.libraries_to_stderr():
        manifest, skipped = stage.run(loaded, force=force, allow_pickle=allow_pickle)
    if rank != 0:
        return
    if json_out:
        output.emit_json("convert", {"skipped": skipped, "stage_dir": str(stage.stage_path(loaded)), "manifest": manifest})
        return
    target, draft, decisions = manifest["target"], manifest["draft"], manifest["decisions"]
    quant = manifest["quantization"]
    head = draft.get("source") or f"new head ({draft.get('init') or 'trained'})"
    output.print_table(
        f"convert: {loaded.name}" + (" (unchanged, reused)" if skipped else ""),
        [
            ("target", f"{target['source']} ({target['architecture']}, {target['num_hidden_layers']} layers, hidden {target['hidden_size']}, vocab {target['vocab_size']})"),
            ("target out", f"{manifest['artifacts']['target_dir']} ({(target.get('copy') or {}).get('method') or quant['format']})"),
            ("dtype", target["dtype"]),
            ("quantization", quant["format"] if quant["format"] == "none" else f"{quant['quant_algo']} (kv cache: {quant.get('kv_cache_quant_algo')})"),
            ("draft head", f"{head}" + (f" [{draft['layout']} layout]" if draft.get("layout") else "")),
            ("draft out", manifest["artifacts"]["draft_dir"]),
            ("aux layers", f"{decisions['aux_layer_ids']} (output of layer i; {decisions['aux_layer_source']})"),
            ("draft vocab", decisions["draft_vocab_size"]),
            ("rope", f"theta {draft['rope_theta']}, scaling {draft['rope_scaling']} ({draft['rope_export']})"),
            *_training_rows(manifest.get("training")),
            *_quantization_rows(quant.get("acceptance")),
            ("checks", f"{sum(c['ok'] for c in manifest['checks'])}/{len(manifest['checks'])} passed"),
            ("time", f"{manifest['timings']['total_s']:.1f} s" + _quant_check_time(manifest["timings"])),
        ],
    )


def _training_rows(training: dict | None) -> list[tuple[str, str]]:
    if not training:
        return []
    data, vocab = training["data"], training["draft_vocab"]
    rows = [
        ("training data", f"{data['sequences']} sequences, {data['trained_tokens']} trained tokens "
                          f"({data['synthesized_tokens']} synthesized, {data['text_tokens']} teacher-forced text)"),
        ("training", f"{training['steps']}/{training['total_steps']} steps in {training['train_s'] / 60:.1f} min "
                     f"(stopped by {training['stopped_by']}), best at step {training['best_step']}; "
                     f"draft vocab coverage {vocab['coverage']:.1%}"),
    ]
    evaluation = training.get("evaluation")
    for name, shape in ((evaluation or {}).get("shapes") or {}).items():
        rows.append((f"held-out {name}", f"tau {shape['acceptance_length']:.2f}, per position "
                     f"{shape['per_position_acceptance']}, {shape['speedup_vs_plain']}x plain reference decoding"
                     + ("" if shape["identical_to_plain"] else " (OUTPUT DIFFERS)")))
    return rows


def _relaunch(processes: int, args: list[str]) -> int:
    """Run this convert again under torchrun, one process per device (draft.train.num_processes)."""
    import subprocess
    import sys

    from .. import output

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
               "-m", "specconvert", "convert", *args]
    output.log(f"draft.train.num_processes={processes}: launching {' '.join(command[1:])}")
    try:
        return subprocess.run(command).returncode
    except KeyboardInterrupt:
        return 130


EXIT_CODES = exit_codes(one="a check failed: export not equal to the head, or the quantization gate "
                        "(quantize.max_acceptance_drop)", four="an external process failed (torchrun, the vLLM that synthesizes)")


def register(app: typer.Typer) -> None:
    app.command("convert", epilog=EXIT_CODES, cls=Command)(convert)


def _quantization_rows(acceptance: dict | None) -> list[tuple[str, str]]:
    """tau on the unquantized and the quantized target, per shape, and the gate's verdict."""
    if not acceptance:
        return []
    rows = [(f"quantized {name}", f"tau {d['tau_unquantized']:.2f} -> {d['tau_quantized']:.2f} (drop {d['tau_drop']:+.2f}, "
                                  f"{d['relative_drop']:+.1%}); per position {d['per_position_unquantized']} -> {d['per_position_quantized']}")
            for name, d in acceptance["drop"].items()]
    verdict = acceptance["gate"]
    rows.append(("acceptance gate", "not set (quantize.max_acceptance_drop)" if not verdict["set"] else "passed"))
    if acceptance.get("plot"):
        rows.append(("acceptance plot", acceptance["plot"]))
    return rows


def _quant_check_time(timings: dict) -> str:
    """The quantization check's extra held-out pass(es), next to the total."""
    parts = [f"{label} {timings[key]:.1f} s" for key, label in
             (("quant_check_unquantized_s", "unquantized pass"), ("quant_check_quantized_s", "quantized pass")) if key in timings]
    return f" (quantization check: {', '.join(parts)})" if parts else ""
