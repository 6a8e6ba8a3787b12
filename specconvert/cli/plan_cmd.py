"""`specconvert plan RECIPE`: where every stage runs and the memory it needs, before anything is downloaded."""

from __future__ import annotations

from typing import Optional

import typer
from typing_extensions import Annotated

from ._options import Command, JsonOpt, RecipeArg, SetOpt, exit_codes, start

GpusOpt = Annotated[Optional[int], typer.Option("--gpus", metavar="N", help="GPUs to plan for (default: this machine's; 0 = CPU only).",
                                                 show_default=False)]
GpuMemOpt = Annotated[Optional[float], typer.Option("--gpu-memory-gib", metavar="GIB", help="Memory of each GPU in GiB (default: this "
                                                    "machine's smallest GPU).", show_default=False)]


def plan(recipe: RecipeArg, gpus: GpusOpt = None, gpu_memory_gib: GpuMemOpt = None, overrides: SetOpt = None,
         json_out: JsonOpt = False) -> None:
    """Plan every stage of RECIPE from config.json alone: where it runs, peak memory per GPU and in host RAM.

    Exit 0 when everything fits; 2 when a stage does not (each one named with its need, room and fix).
    """
    from .. import output
    from ..errors import InputError
    from ..stages.plan import hardware_for, make_plan

    r = start(recipe, overrides, json_out=json_out)
    doc = make_plan(r, hardware_for(gpus, gpu_memory_gib))
    if json_out:
        output.emit_json("plan", doc)
    else:
        _print(doc)
    if not doc["ok"]:
        raise InputError(f"{len(doc['problems'])} stage(s) do not fit: {doc['problems'][0]}", problems=doc["problems"])


def _print(doc: dict) -> None:
    from .. import output

    hw, t, d = doc["hardware"], doc["target"], doc["draft"]
    gpus = f"{hw['gpus']} GPU(s) x {hw['gpu_gib']:g} GiB" if hw["gpus"] else "no GPU (CPU only)"
    output.print_table(f"plan: {doc['recipe']} on {gpus} ({hw['source']})", [
        ("target", f"{t['source']}: {t['parameters'] / 1e9:.2f} B parameters, {t['weights_gib']} GiB in {t['dtype']}"),
        ("draft head", f"{d['parameters'] / 1e6:.0f} M parameters, {d['bytes_gib']} GiB, {d['source']}"),
        ("host RAM", "unknown" if hw["host_gib"] is None else f"{hw['host_gib']:g} GiB"),
    ])
    rows = []
    for s in doc["stages"]:
        if not s["runs"]:
            rows.append((s["stage"], s["where"]))
            continue
        mark = "fits" if s["fits"] else "DOES NOT FIT"
        gpu = f"{s['per_gpu_gib']:.1f} GiB per GPU" if s["gpus_used"] else "no GPU"
        room = "" if s["room_gib"] is None else f" (room {s['room_gib']:.1f})"
        text = f"{mark}: {s['where']}; {gpu}{room}, host {s['host_gib']:.1f} GiB. {s['detail']}"
        if s["estimated"]:
            text += f" [estimated: {', '.join(s['estimated'])}]"
        if s["fix"]:
            text += f". Fix: {s['fix']}"
        rows.append((s["stage"], text))
    output.print_table("stages", rows)


EXIT_CODES = exit_codes(one="an unexpected error (run again with --debug)",
                        two="a stage does not fit (each named with its need, room and fix), or bad input",
                        four="not used")


def register(app: typer.Typer) -> None:
    app.command("plan", epilog=EXIT_CODES, cls=Command)(plan)
