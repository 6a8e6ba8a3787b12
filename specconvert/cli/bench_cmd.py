"""`specconvert bench`: speculative vs baseline latency/throughput through the OpenAI-compatible API."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from typing_extensions import Annotated

from ._options import JsonOpt, QuietOpt, SetOpt, VerifyOpt

UrlOpt = Annotated[Optional[str], typer.Option(
    "--url", help="Bench an already running OpenAI-compatible endpoint (trtllm-serve, vLLM, SGLang, specconvert serve) "
    "instead of starting the bundle's server.", show_default=False)]
BaselineUrlOpt = Annotated[Optional[str], typer.Option(
    "--baseline-url", help="The same target served without speculation (default: the --url endpoint's "
    "`<model>-baseline` twin when it lists one).", show_default=False)]
OutOpt = Annotated[Optional[Path], typer.Option(
    "--out", help="Where to write the bench directory (default: <workdir>/bench; runs/bench-url with --url and no recipe).",
    show_default=False)]
TrtllmBenchOpt = Annotated[bool, typer.Option(
    "--trtllm-bench", help="Also run TensorRT-LLM's `trtllm-bench latency` on the bundle (engine/trtllm/bench.sh) "
    "and keep its reports beside ours (trtllm backend).")]


def bench(
    recipe: Annotated[Optional[Path], typer.Argument(help="Recipe YAML (optional with --url).", show_default=False)] = None,
    set_: SetOpt = None,
    url: UrlOpt = None,
    baseline_url: BaselineUrlOpt = None,
    out: OutOpt = None,
    trtllm_bench: TrtllmBenchOpt = False,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
    verify: VerifyOpt = False,
) -> None:
    """Measure TTFT, TPOT, ITL, E2E, throughput and acceptance, baseline and speculative interleaved -> <workdir>/bench/."""
    from .. import output
    from ..bench.report import print_summary
    from ..errors import CheckFailed, ExternalFailure, InputError
    from ..recipe import BenchSpec, apply_overrides, validate_recipe
    from ..stages import bench as bench_stage
    from ._options import start

    if recipe is not None:
        loaded = start(recipe, set_, json_out, quiet)
        spec, base_dir, out_dir, name = loaded.bench, loaded.base_dir, out or bench_stage.bench_dir(loaded), loaded.name
    else:
        if url is None:
            raise InputError("bench needs a recipe or --url", fix="specconvert bench RECIPE, or specconvert bench --url http://HOST:PORT")
        output.set_mode(json_mode=json_out, quiet=quiet or json_out)
        loaded = None
        # Only `bench.*` overrides make sense without a recipe; validate them through the same schema.
        data = apply_overrides({}, list(set_ or []))
        unknown = [k for k in data if k != "bench"]
        if unknown:
            raise InputError(f"--set {unknown[0]}.…: without a recipe only bench.* keys apply", fix="pass a recipe, or set bench.* keys")
        spec = validate_recipe({"name": "bench-url", "target": {"model": "unused"}, "draft": {"init": "random"},
                                "bench": data.get("bench") or {}}, source="--set").bench
        base_dir, out_dir, name = Path.cwd(), out or Path("runs/bench-url/bench"), None
    result = bench_stage.run(spec, Path(out_dir).resolve(), base_dir, recipe=loaded, recipe_path=recipe,
                             overrides=list(set_ or []), url=url, baseline_url=baseline_url, trtllm_bench=trtllm_bench,
                             name=name, verify=verify)
    report = result.report
    if json_out:
        output.emit_json("bench", {"bench_dir": str(result.bench_dir), "report": report})
    else:
        print_summary(report)
        output.log(f"bench: report in {result.bench_dir}/report.md")
    if result.failed_requests:
        raise ExternalFailure(f"{result.failed_requests} request(s) failed during bench",
                              fix=f"see the errors in {result.bench_dir}/requests.jsonl and the server log")
    if result.gate_failed:
        gate = report["gate"]
        raise CheckFailed(
            f"speedup gate failed: median output-throughput speedup {gate['lowest_median'] if gate['lowest_median'] is not None else 'n/a'}"
            f" at concurrency {gate['lowest_level']} is below bench.fail_below_speedup = {gate['fail_below_speedup']}",
            fix=f"see {result.bench_dir}/report.md")


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
