"""`specconvert bench`: speculative vs baseline latency/throughput through the OpenAI-compatible API."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from typing_extensions import Annotated

from ._options import Command, BaselineUrlOpt, JsonOpt, QuietOpt, SetOpt, UrlOpt, VerifyOpt, exit_codes

OutOpt = Annotated[Optional[Path], typer.Option(
    "--out", metavar="DIR", help="Where to write the bench directory (default: <workdir>/bench; runs/bench-url/bench "
    "with --url and no recipe).", show_default=False)]
TrtllmBenchOpt = Annotated[bool, typer.Option(
    "--trtllm-bench", help="Also run TensorRT-LLM's `trtllm-bench latency` on the bundle (engine/trtllm/bench.sh) "
    "and keep its reports beside ours (trtllm backend).")]
# The workload flags carry the names `vllm bench serve` uses (vllm/benchmarks/serve.py: --max-concurrency,
# --output-len, --ignore-eos; vllm/benchmarks/datasets/datasets.py: --num-prompts; vLLM 0.32.0). Each one is
# the same as a `--set bench.KEY=...` and wins over the recipe and --set.
ConcurrencyOpt = Annotated[Optional[str], typer.Option(
    "--max-concurrency", "--concurrency", metavar="N[,N...]", show_default=False,
    help="Requests in flight; a comma list runs each level (bench.concurrency).")]
NumPromptsOpt = Annotated[Optional[int], typer.Option(
    "--num-prompts", min=1, metavar="N", show_default=False, help="Measured requests per run (bench.num_requests).")]
OutputLenOpt = Annotated[Optional[int], typer.Option(
    "--output-len", "--max-tokens", min=1, metavar="N", show_default=False,
    help="`max_tokens` of every request (bench.max_tokens).")]
IgnoreEosOpt = Annotated[bool, typer.Option(
    "--ignore-eos", help="Every request generates exactly --output-len tokens (bench.ignore_eos).")]
FailBelowOpt = Annotated[Optional[float], typer.Option(
    "--fail-below-speedup", metavar="X", show_default=False,
    help="CI gate (bench.fail_below_speedup): exit 1 when the median output-throughput speedup over the baseline "
    "is below X at any measured concurrency level; the report names the lowest level and its median.")]


def workload_overrides(concurrency: str | None, num_prompts: int | None, output_len: int | None, ignore_eos: bool,
                       fail_below_speedup: float | None) -> list[str]:
    """The workload flags as ``bench.*`` overrides (validated with the recipe, like any --set)."""
    from ..errors import InputError

    out = []
    if concurrency is not None:
        try:
            levels = [int(part) for part in concurrency.split(",") if part.strip()]
        except ValueError:
            levels = []
        if not levels:
            raise InputError(f"--max-concurrency {concurrency}: not a number or a comma list of numbers",
                             fix="e.g. --max-concurrency 4, or --max-concurrency 1,4,16")
        out.append(f"bench.concurrency={levels}")
    if num_prompts is not None:
        out.append(f"bench.num_requests={num_prompts}")
    if output_len is not None:
        out.append(f"bench.max_tokens={output_len}")
    if ignore_eos:
        out.append("bench.ignore_eos=true")
    if fail_below_speedup is not None:
        out.append(f"bench.fail_below_speedup={fail_below_speedup}")
    return out


def bench(
    recipe: Annotated[Optional[str], typer.Argument(help="Recipe YAML or shipped recipe name (optional with --url).",
                                                    metavar="RECIPE", show_default=False)] = None,
    set_: SetOpt = None,
    url: UrlOpt = None,
    baseline_url: BaselineUrlOpt = None,
    concurrency: ConcurrencyOpt = None,
    num_prompts: NumPromptsOpt = None,
    output_len: OutputLenOpt = None,
    ignore_eos: IgnoreEosOpt = False,
    fail_below_speedup: FailBelowOpt = None,
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
    from ._options import recipe_file, start

    set_ = list(set_ or []) + workload_overrides(concurrency, num_prompts, output_len, ignore_eos, fail_below_speedup)
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
    recipe_path = recipe_file(recipe) if recipe is not None else None
    result = bench_stage.run(spec, Path(out_dir).resolve(), base_dir, recipe=loaded, recipe_path=recipe_path,
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


EXIT_CODES = exit_codes(one="a check failed: the speedup gate (--fail-below-speedup, bench.fail_below_speedup)",
                        four="a request or a server bench started failed")


def register(app: typer.Typer) -> None:
    app.command("bench", epilog=EXIT_CODES, cls=Command)(bench)
