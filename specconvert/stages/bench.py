"""The bench stage: interleaved baseline/speculative load runs -> <workdir>/bench/.

Endpoints come from ``--url``/``--baseline-url`` or from servers bench starts for the
recipe's bundle. Per concurrency level the runs alternate baseline, speculative,
baseline, speculative (``bench.repeats`` pairs) so machine drift hits both sides
alike; the speedup is summarised over the pairs. Everything is written through
``manifest.stage_dir`` so a crashed bench leaves the previous report intact.

Arms: besides the baseline and the bundle (``speculative``: tuned when the bundle carries a
`specconvert tune` result), ``bench.fixed_draft_lens`` adds ``fixed-kN`` servers that draft a
fixed chain of N; they join the same interleaved order (baseline, fixed-k.., speculative), and
each level reports the bundle against the best of the baseline and every fixed arm.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__, output
from ..backends.names import fixed_chain_model
from ..bench import metrics as M
from ..bench.loadgen import Endpoint, drain_metrics, list_models, run_load, stream_request
from ..bench.preflight import context_check, free_arms
from ..bench.report import DEFINITIONS, REPORT_SCHEMA_VERSION, render_markdown, write_plots
from ..bench.workload import Run, arm_labels, build_payloads, interleaved_schedule, load_prompt_samples, resolve_api
from ..errors import CheckFailed, ExternalFailure, InputError
from ..manifest import manifest_hash, read_manifest, require_current_engine, require_manifest, stage_dir, write_json_atomic
from ..serving.urls import redact_url
from ..workdir import workdir_lock

STAGE = "bench"


@dataclass
class BenchResult:
    report: dict[str, Any]
    bench_dir: Path
    manifest: dict[str, Any]

    @property
    def failed_requests(self) -> int:
        return self.report["failed_requests"]

    @property
    def gate_failed(self) -> bool:
        gate = self.report.get("gate")
        return bool(gate) and not gate["passed"]


def bench_dir(recipe: Any) -> Path:
    return recipe.workdir_path / "bench"


def run(bench: Any, out_dir: Path, base_dir: Path, *, recipe: Any = None, **options: Any) -> BenchResult:
    """Measure and write the report. ``recipe`` is needed unless ``url`` is given.

    When bench reads the recipe's bundle (no ``--url``, or ``--trtllm-bench``), the workdir is locked before
    ``engine/`` is first read and until the report is written, also when ``--out`` lies outside it: a build
    cannot swap the bundle under a running bench. Benching a ``--url`` reads nothing there and locks nothing.
    """
    reads_engine = recipe is not None and (options.get("url") is None or options.get("trtllm_bench"))
    with workdir_lock(recipe.workdir_path) if reads_engine else nullcontext():
        return _run(bench, out_dir, base_dir, recipe=recipe, **options)


def _run(
    bench: Any,
    out_dir: Path,
    base_dir: Path,
    *,
    recipe: Any = None,
    recipe_path: Path | None = None,
    overrides: list[str] | None = None,
    url: str | None = None,
    baseline_url: str | None = None,
    trtllm_bench: bool = False,
    name: str | None = None,
    verify: bool = False,
) -> BenchResult:
    engine_dir = recipe.workdir_path / "engine" if recipe is not None else None
    if recipe is not None and (url is None or trtllm_bench):
        # exit 2 when engine/ predates convert/, or convert's sealed files changed (every hash with --verify)
        require_current_engine(recipe.workdir_path, verify=verify)
    engine_manifest = None
    bench_script = None
    if trtllm_bench:
        if recipe is None or recipe.runtime.backend != "trtllm":
            raise InputError("--trtllm-bench runs the bundle's TensorRT-LLM bench.sh: it needs a recipe with "
                             "`runtime.backend: trtllm`", fix="pass a trtllm recipe, or drop --trtllm-bench")
        from ..bench.trtllm_bench import require_trtllm_bench

        engine_manifest = require_manifest(engine_dir, "build", "build")
        bench_script = require_trtllm_bench(engine_dir)  # exit 3 before anything is measured
    if url is None:
        if recipe is None:
            raise InputError("bench needs a recipe or --url", fix="pass RECIPE, or --url http://HOST:PORT")
        engine_manifest = engine_manifest or require_manifest(engine_dir, "build", "build")
    if baseline_url and not url:
        raise InputError("--baseline-url needs --url (the speculative endpoint)", fix="pass both, or neither")

    from ..bench.servers import fixed_label

    tuned = bool(engine_manifest and (engine_manifest.get("decisions") or {}).get("tuned"))
    fixed = fixed_draft_lens(bench, recipe, tuned, url)
    fixed_labels = [fixed_label(n) for n in fixed]
    free = free_arms(bench, recipe, url, recipe_path)
    extra_labels = fixed_labels + free  # every arm between the baseline and the bundle, in run order
    loaded = load_prompt_samples(bench.prompts, base_dir) if bench.prompts != "synthetic" else None
    api = resolve_api(bench.api, loaded[0] if loaded else None)
    payloads, workload = build_payloads(bench, base_dir, api, loaded)
    context = context_check(bench, recipe)
    inputs = {
        "bench": bench.model_dump(mode="json"),
        "url": redact_url(url),
        "baseline_url": redact_url(baseline_url),
        "engine_manifest": manifest_hash(engine_manifest) if engine_manifest else None,
        "time": time.time(),  # a measurement is never "up to date"
    }
    draft_lens = {"speculative": _served_draft_lens(recipe, engine_manifest, bench.concurrency),
                  **{fixed_label(n): n for n in fixed}, **{label: _free_draft_len(recipe, bench) for label in free}}
    vllm = url is None and recipe.runtime.backend == "vllm"
    counters = None
    if vllm:
        from ..backends.vllm import counters

        # vLLM sends token ids per chunk when asked: exact tokens per chunk instead of apportioned text
        payloads = [{**p, "return_token_ids": True} for p in payloads]
    together, why, placement = True, None, None
    if vllm:
        from ..bench.servers import vllm_placement

        placement = vllm_placement(recipe, recipe_path, engine_dir, arm_labels(bench.compare_baseline, extra_labels))
        together, why = placement.together, placement.why
        if not together and recipe.runtime.vllm_servers == "auto":
            how = "one after the other" if placement.mode == "sequential" else placement.mode
            output.warn(f"bench: {why}: the vLLM servers run {how}, so machine drift between them is not "
                        "cancelled (runtime.vllm_servers: together forces them up at once)")
    with stage_dir(out_dir, STAGE, inputs) as stage:
        if not together:
            measured, server_info = _measure_one_server_at_a_time(bench, api, payloads, recipe, recipe_path, engine_dir,
                                                                  stage.path, draft_lens, counters, extra_labels,
                                                                  placement)
        else:
            if url is None:
                from ..bench.servers import recipe_servers

                servers = recipe_servers(recipe, recipe_path, overrides or [], engine_dir, stage.path,
                                         bench.startup_timeout_s, fixed, placement=placement)
            else:
                servers = nullcontext({"speculative": url, "baseline": baseline_url or url, "servers": []})
            with servers as started:
                # The reference server and vLLM name their models after the recipe; trtllm-serve after the target.
                default_model = recipe.name if (url is None and recipe.runtime.backend in ("reference", "vllm")) else None
                measured = asyncio.run(_measure(bench, api, payloads, started, default_model=default_model,
                                                draft_lens=draft_lens, counters=counters, fixed_labels=extra_labels))
            server_info = started["servers"]
        if why:
            measured["servers_together"] = {"together": together, "why": why}
        if placement is not None:
            measured["placement"] = placement.as_dict()
        report = _assemble(bench, workload, measured, name or (recipe.name if recipe is not None else None),
                           servers=server_info, tuned=tuned, fixed_labels=fixed_labels, free_labels=free)
        report["context"] = context
        trt = None
        if bench_script is not None:
            from ..bench.trtllm_bench import run_trtllm_bench

            trt = run_trtllm_bench(bench_script, stage.path, bench.compare_baseline, bench.run_timeout_s)
            report["trtllm_bench"] = {k: v for k, v in trt.items() if k != "summaries"} | {"summaries": trt["summaries"]}
        files = _write(stage.path, report, measured["records"], bench.plots)
        # Paths point into the staging directory until stage_dir swaps it in: name the final place.
        report = json.loads(json.dumps(report, default=str).replace(str(stage.path), str(out_dir)))
        write_json_atomic(stage.path / "report.json", report)
        stage.finish(
            artifacts={k: v for k, v in files.items()},
            summary={"levels": [{"concurrency": lv["concurrency"], "speedup_median": ((lv.get("speedup") or {})
                                 .get("output_tokens_per_s") or {}).get("median")} for lv in report["levels"]],
                     "acceptance_length": (report.get("acceptance") or {}).get("acceptance_length"),
                     "failed_requests": report["failed_requests"], "gate": report.get("gate")},
        )
    final = read_manifest(out_dir) or stage.manifest
    report = json.loads((out_dir / "report.json").read_text(encoding="utf-8"))
    return BenchResult(report, out_dir, final)


def _served_draft_lens(recipe: Any, engine_manifest: dict[str, Any] | None, levels: list[int]) -> Any:
    """The chain the bundle serves at each level (a tuned schedule's entry for that batch size): one number
    when it is the same at every level, else {level: length}; None without a recipe (``--url`` alone)."""
    if recipe is None:
        return None
    from .outputs import served_draft_len

    per_level = {b: served_draft_len(engine_manifest, recipe.runtime.backend, b, recipe.build.max_draft_len)
                 for b in levels}
    return per_level[levels[0]] if len(set(per_level.values())) == 1 else per_level


def draft_len_of(draft_lens: dict[str, Any], label: str, level: int | None = None) -> int | None:
    """An arm's draft length at ``level`` (None: at every level, or None when it varies with the level)."""
    value = draft_lens.get(label)
    if isinstance(value, dict):
        return value.get(level) if level is not None else None
    return value


def _free_draft_len(recipe: Any, bench: Any) -> int:
    from ..backends.vllm.launch import free_draft_len

    return free_draft_len(recipe.build, bench.ngram)


def fixed_draft_lens(bench: Any, recipe: Any, tuned: bool, url: str | None) -> list[int]:
    """The ``fixed-kN`` arms: ``bench.fixed_draft_lens``, where ``auto`` = the recipe's own chain next to a tuned
    bundle (``tuned``: the bundle carries a tune result)."""
    if bench.fixed_draft_lens == "auto":
        return [recipe.build.max_draft_len] if (url is None and recipe is not None and tuned) else []
    lens = list(bench.fixed_draft_lens)
    if lens and url is not None:
        raise InputError(f"bench.fixed_draft_lens {lens}: fixed-length arms are servers bench starts itself, and "
                         "--url benches a server you started", fix="drop --url (bench starts the bundle's servers), "
                         "or --set bench.fixed_draft_lens=[]")
    return lens


# --------------------------------------------------------------------------- measuring


def _measure_one_server_at_a_time(bench: Any, api: str, payloads: list[dict[str, Any]], recipe: Any, recipe_path: Path,
                                  engine_dir: Path, log_dir: Path, draft_lens: dict[str, int | None],
                                  counters: Any, fixed_labels: list[str], placement: Any = None
                                  ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """vLLM where not every server fits at once: one wave of servers at a time (``placement.waves``; one server per
    wave on a small machine), each arm's runs in turn. Without interleaving, machine drift between the parts is
    not cancelled: the report says so."""
    from ..bench.servers import vllm_server

    fixed = [draft_lens[label] for label in fixed_labels if label.startswith("fixed-k")]  # not the free arms
    labels = arm_labels(bench.compare_baseline, fixed_labels)
    waves = [list(w) for w in placement.waves] if placement is not None else [[label] for label in labels]
    parts, servers = [], []
    for wave in waves:
        with vllm_server(recipe, recipe_path, engine_dir, wave, log_dir, bench.startup_timeout_s, fixed,
                         placement) as started:
            for label in wave:
                if label in recipe.bench.baselines:
                    model = f"{recipe.name}-{label}"  # backends.vllm.launch.free_launch
                elif label in fixed_labels:
                    model = fixed_chain_model(recipe.name, draft_lens[label])
                else:
                    model = (bench.model if label == "speculative" else bench.baseline_model) or (
                        recipe.name if label == "speculative" else f"{recipe.name}-baseline")
                parts.append(asyncio.run(_measure(bench, api, payloads, started, default_model=None,
                                                  draft_lens=draft_lens, counters=counters,
                                                  fixed_labels=fixed_labels, only=(label, model))))
            servers += started["servers"]
    measured = parts[0]
    for part in parts[1:]:
        for key in ("schedule", "runs", "records"):
            measured[key] = measured[key] + part[key]
        measured["endpoints"] = {**measured["endpoints"], **part["endpoints"]}
        measured["metrics_seen"] = {**measured["metrics_seen"], **part["metrics_seen"]}
    if all(len(wave) == 1 for wave in waves):
        measured["order"] = (f"sequential: all runs of each arm in turn ({', '.join(labels)}), one server up at a "
                             "time (runtime.vllm_servers)")
    else:
        measured["order"] = (f"{placement.mode}: all runs of each arm in turn ({', '.join(labels)}), the servers "
                             f"up {' then '.join('+'.join(w) for w in waves)} (runtime.vllm_servers)")
    return measured, servers


async def _measure(bench: Any, api: str, payloads: list[dict[str, Any]], started: dict[str, Any],
                   default_model: str | None, draft_lens: dict[str, int | None], counters: Any = None,
                   fixed_labels: list[str] | None = None, only: tuple[str, str] | None = None) -> dict[str, Any]:
    """``only=(label, model)``: one server is up; run that label's part of the schedule against it."""
    from contextlib import AsyncExitStack

    from ..serving.client import OpenAIClient

    levels = list(bench.concurrency)
    fixed_labels = fixed_labels or []
    schedule = interleaved_schedule(levels, bench.repeats, bench.compare_baseline, fixed_labels)
    if only is not None:
        schedule = [r for r in schedule if r.label == only[0]]
    async with AsyncExitStack() as stack:
        clients: dict[str, Any] = {}

        def client_for(url: str) -> Any:
            if url not in clients:
                clients[url] = OpenAIClient(url, request_timeout_s=bench.request_timeout_s,
                                            max_connections=max(levels) + 4)
                stack.push_async_callback(clients[url].aclose)
            return clients[url]

        if only is not None:
            endpoints = {only[0]: Endpoint(only[0], started[only[0]].rstrip("/"), only[1], api)}
        else:
            endpoints = await _endpoints(client_for, bench, api, started, default_model)
            for label in fixed_labels:  # each fixed or free arm's own server: the model it lists
                url = started[label].rstrip("/")
                ids = await list_models(client_for(url))
                model = next((m for m in ids if not m.endswith("-baseline")), ids[0] if ids else None)
                endpoints[label] = Endpoint(label, url, model, api)
        metrics_seen = {label: False for label in endpoints}
        for label, endpoint in endpoints.items():
            if bench.warmup_requests:
                output.log(f"bench: {bench.warmup_requests} warm-up request(s) to the {label} endpoint")
            for i in range(bench.warmup_requests):
                record = await stream_request(client_for(endpoint.base_url), endpoint, payloads[i % len(payloads)], -1 - i)
                if record.error:
                    raise ExternalFailure(f"bench: warm-up request to {redact_url(endpoint.base_url)}{endpoint.path} failed: {record.error}",
                                          fix="check the server log and that the model name is served (GET /v1/models)")
        runs: list[dict[str, Any]] = []
        records: list[dict[str, Any]] = []
        with output.progress() as bar:
            task = bar.add_task("bench", total=len(schedule) * len(payloads))
            for run in schedule:
                endpoint = endpoints[run.label]
                client = client_for(endpoint.base_url)
                bar.update(task, description=run.name)
                await drain_metrics(client)  # whatever earlier traffic left behind
                reader = counters if (counters is not None and run.label != "baseline") else None
                before = await reader.snapshot(client) if reader else None
                started_at = time.time()
                recs, duration = await run_load(client, endpoint, payloads, run.concurrency, bench.run_timeout_s,
                                                on_done=lambda _r: bar.advance(task))
                counted = reader.delta(before, await reader.snapshot(client), requests=len(recs)) if reader else None
                items = await drain_metrics(client)
                metrics_seen[run.label] = metrics_seen[run.label] or items is not None or counted is not None
                runs.append(_run_entry(run, recs, duration, items, started_at,
                                       draft_len_of(draft_lens, run.label, run.concurrency), counted))
                for rec in recs:
                    records.append({"run": run.name, "label": run.label, "concurrency": run.concurrency,
                                    "repeat": run.repeat, **M.request_metrics(rec)})
                summary = runs[-1]["summary"]
                output.log(f"bench: {run.name}: {summary['output_tokens_per_s'] or 0:.1f} tok/s, {summary['failed']} failed")
    return {"endpoints": endpoints, "metrics_seen": metrics_seen, "schedule": [r.name for r in schedule], "runs": runs,
            "records": records, "levels": levels, "draft_lens": draft_lens}


async def _endpoints(client_for: Any, bench: Any, api: str, started: dict[str, Any],
                     default_model: str | None) -> dict[str, Endpoint]:
    """Model names: the recipe's, the user's, else what ``GET /v1/models`` lists (a second server: its first model;
    the same server: the ``<model>-baseline`` twin)."""
    spec_url = started["speculative"].rstrip("/")
    ids = await list_models(client_for(spec_url))
    spec_model = bench.model or default_model
    if spec_model is None and ids:
        spec_model = next((m for m in ids if not m.endswith("-baseline")), ids[0])
    endpoints = {"speculative": Endpoint("speculative", spec_url, spec_model, api)}
    if not bench.compare_baseline:
        return endpoints
    base_url = (started.get("baseline") or spec_url).rstrip("/")
    base_model = bench.baseline_model
    if base_model is None:
        if base_url != spec_url:
            base_ids = await list_models(client_for(base_url))
            base_model = base_ids[0] if base_ids else None
        else:
            twin = f"{spec_model}-baseline" if spec_model else None
            base_model = twin if twin and (twin in ids or (default_model and not ids)) else None
            if base_model is None:
                raise InputError(
                    f"bench.compare_baseline: {redact_url(spec_url)} serves no baseline twin of '{spec_model}' "
                    f"(models: {', '.join(ids) or 'none listed'})",
                    fix="pass --baseline-url for the same target served without speculation, set bench.baseline_model, "
                    "or --set bench.compare_baseline=false")
    return {"baseline": Endpoint("baseline", base_url, base_model, api), **endpoints}


def _run_entry(run: Run, recs: list[M.RequestRecord], duration: float, items: list[dict[str, Any]] | None,
               started_at: float, max_draft_len: int | None, counted: Any = None) -> dict[str, Any]:
    entry = {"name": run.name, "label": run.label, "concurrency": run.concurrency, "repeat": run.repeat,
             "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_at)),
             "summary": M.summarize_run(recs, duration), "acceptance": None, "server_metrics_items": None,
             "_records": recs, "_items": items, "_counted": counted}
    if run.label != "baseline":
        entry["server_metrics_items"] = len(items) if items is not None else None
        entry["acceptance"] = _acceptance(items, recs, max_draft_len, [counted] if counted is not None else [])
    return entry


def _acceptance(items: list[dict[str, Any]] | None, recs: list[M.RequestRecord], max_draft_len: int | None,
                counted: list[Any]) -> dict[str, Any]:
    """Engine counters when the backend has them (vLLM), else /perf_metrics, else the stream-chunk estimate.
    With counters, the chunk estimate of the same requests and its error are recorded beside them."""
    chunks = M.acceptance_from_chunks(recs)
    if counted:
        from ..acceptance import combine

        total = combine(counted)
        if total is not None and total.available:
            est = chunks.get("acceptance_length")
            return {"source": total.source, "measured_by": total.label, "estimate": False,
                    "acceptance_length": round(total.acceptance_length, 4),
                    "acceptance_rate": (round(total.accepted_tokens / total.draft_tokens, 4)
                                        if total.draft_tokens else None),
                    "per_position": [round(p, 4) for p in total.per_position] if total.per_position else None,
                    "steps": total.drafts, "requests": len([r for r in recs if r.ok]),
                    "chunk_estimate": est,
                    "chunk_estimate_error": round(est - total.acceptance_length, 4) if est is not None else None}
    return (M.acceptance_from_server(items, max_draft_len) if items else None) or chunks


# --------------------------------------------------------------------------- the report


def _pairs(runs: list[dict[str, Any]], level: int, repeats: int, first: str, second: str) -> list[tuple[dict, dict]]:
    """(first, second) run summaries of the same repeat at one level."""
    out = []
    for repeat in range(repeats):
        a = next((r for r in runs if r["label"] == first and r["concurrency"] == level and r["repeat"] == repeat), None)
        b = next((r for r in runs if r["label"] == second and r["concurrency"] == level and r["repeat"] == repeat), None)
        if a and b:
            out.append((a["summary"], b["summary"]))
    return out


def versus_best(level: dict[str, Any], labels: list[str]) -> dict[str, Any] | None:
    """The bundle's output tok/s against the best other arm at one level (runs pooled): the tuning speed target."""
    spec = (level.get("speculative") or {}).get("output_tokens_per_s")
    others = {label: (level.get(label) or {}).get("output_tokens_per_s") for label in labels if label != "speculative"}
    others = {k: v for k, v in others.items() if v}
    if not spec or not others:
        return None
    best = max(others, key=others.get)
    base = others.get("baseline")
    return {"best_other": best, "best_other_output_tokens_per_s": round(others[best], 3),
            "speculative_output_tokens_per_s": round(spec, 3), "ratio_to_best_other": round(spec / others[best], 4),
            "ratio_to_baseline": round(spec / base, 4) if base else None}


def _assemble(bench: Any, workload: dict[str, Any], measured: dict[str, Any], name: str | None,
              servers: list[dict[str, Any]], tuned: bool = False, fixed_labels: list[str] | None = None,
              free_labels: list[str] | None = None) -> dict[str, Any]:
    runs = measured["runs"]
    fixed_labels = fixed_labels or []
    free_labels = free_labels or []
    labels = arm_labels(bench.compare_baseline, fixed_labels + free_labels)
    draft_lens = measured["draft_lens"]
    levels = []
    all_spec_records, all_spec_items, all_records, all_counted = [], [], [], []
    for level in measured["levels"]:
        entry: dict[str, Any] = {"concurrency": level}
        arms: dict[str, Any] = {}
        level_records: dict[str, list[M.RequestRecord]] = {}
        for label in ["baseline", *fixed_labels, *free_labels, "speculative"]:
            mine = [r for r in runs if r["label"] == label and r["concurrency"] == level]
            if not mine:
                entry[label] = None
                continue
            recs = [rec for r in mine for rec in r["_records"]]
            level_records[label] = recs
            all_records.extend(recs)
            entry[label] = M.summarize_run(recs, sum(r["summary"]["duration_s"] or 0 for r in mine))
            if label == "baseline":
                continue
            items = [it for r in mine for it in (r["_items"] or [])]
            counted = [r["_counted"] for r in mine if r.get("_counted") is not None]
            acceptance = _acceptance(items, recs, draft_len_of(draft_lens, label, level), counted)
            same = _lossless(runs, level, label, bench) if bench.compare_baseline else None
            if label == "speculative":
                all_spec_records.extend(recs)
                all_spec_items.extend(items)
                all_counted.extend(counted)
                entry["acceptance"] = acceptance
                entry["lossless"] = same
            else:
                vs_base = _pairs(runs, level, bench.repeats, "baseline", label)
                vs_spec = _pairs(runs, level, bench.repeats, label, "speculative")
                arms[label] = {"draft_len": draft_lens.get(label), "acceptance": acceptance,
                               "speedup": M.speedups(vs_base, seed=bench.seed) if vs_base else None,
                               "speculative_vs_this": M.speedups(vs_spec, seed=bench.seed) if vs_spec else None,
                               "lossless": same}
        pairs = _pairs(runs, level, bench.repeats, "baseline", "speculative")
        entry["speedup"] = M.speedups(pairs, seed=bench.seed) if pairs else None
        if any(label in arms for label in fixed_labels):
            entry["fixed"] = {label: arms[label] for label in fixed_labels if label in arms}
        if any(label in arms for label in free_labels):
            entry["free"] = {label: arms[label] for label in free_labels if label in arms}
        entry["versus_best"] = versus_best(entry, labels) if len(labels) > 2 else None
        if workload.get("input_lengths"):
            entry["input_lengths"] = M.grouped(level_records, workload["input_lengths"],
                                               {label: draft_len_of(draft_lens, label, level) for label in level_records})
        if workload.get("categories"):
            entry["categories"] = M.grouped(level_records, workload["categories"],
                                            {label: draft_len_of(draft_lens, label, level) for label in level_records})
        levels.append(entry)
    acceptance = _acceptance(all_spec_items, all_spec_records, draft_len_of(draft_lens, "speculative"), all_counted)
    gate = None
    if bench.fail_below_speedup is not None:
        medians = [(lv["concurrency"], ((lv.get("speedup") or {}).get("output_tokens_per_s") or {}).get("median")) for lv in levels]
        known = [(c, m) for c, m in medians if m is not None]
        lowest = min(known, key=lambda cm: cm[1]) if known else (None, None)
        gate = {"fail_below_speedup": bench.fail_below_speedup, "metric": "output_tokens_per_s median per level",
                "lowest_level": lowest[0], "lowest_median": lowest[1],
                "passed": bool(known) and len(known) == len(medians) and lowest[1] >= bench.fail_below_speedup}
    arm_info = [{"label": "baseline", "draft_len": 0, "setting": "the target alone"}] if bench.compare_baseline else []
    arm_info += [{"label": label, "draft_len": draft_lens.get(label), "setting": f"a fixed chain of {draft_lens.get(label)}"}
                 for label in fixed_labels]
    arm_info += [{"label": label, "draft_len": draft_lens.get(label), "free": True,
                  "setting": FREE_SETTINGS[label].format(k=draft_lens.get(label), ngram=bench.ngram)}
                 for label in free_labels]
    spec_k = draft_lens.get("speculative")  # per level ({"1": 3, "4": 2}) when the bundle's schedule varies
    arm_info.append({"label": "speculative", "tuned": tuned,
                     "draft_len": {str(b): k for b, k in spec_k.items()} if isinstance(spec_k, dict) else spec_k,
                     "setting": ("the bundle's tuned schedule (`specconvert tune`)" if tuned else
                                 "the bundle's setting (build.max_draft_len / build.tree)")})
    endpoints = measured["endpoints"]
    failed = sum(1 for r in all_records if not r.ok)
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "kind": "bench",
        "name": name,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "specconvert_version": __version__,
        "definitions": DEFINITIONS,
        "settings": bench.model_dump(mode="json"),
        "workload": workload,
        "endpoints": {label: {"url": redact_url(ep.base_url), "model": ep.model, "api": ep.api,
                              "metrics_endpoint": measured["metrics_seen"].get(label, False)}
                      for label, ep in endpoints.items()} | ({} if "baseline" in endpoints else {"baseline": None}),
        "servers": servers,
        "arms": arm_info,
        "schedule": measured["schedule"],
        "order": measured.get("order", f"interleaved: {', '.join(labels)}, the order rotating by one each repeat, per level"),
        "servers_together": measured.get("servers_together"),
        "placement": measured.get("placement"),
        "runs": [{k: v for k, v in r.items() if not k.startswith("_")} for r in runs],
        "levels": levels,
        "acceptance": acceptance,
        "client_overhead": M.client_overhead([r for r in all_records if r.ok]),
        "failed_requests": failed,
        "gate": gate,
        "trtllm_bench": None,
    }


FREE_SETTINGS = {
    "ngram": "n-gram prompt lookup, no head: up to {k} tokens copied from a match of "
             "{ngram.prompt_lookup_min}-{ngram.prompt_lookup_max} context tokens (bench.ngram)",
    "suffix": "suffix decoding, no head: up to {k} tokens from suffix trees of the prompt and earlier outputs",
}


def _lossless(runs: list[dict[str, Any]], level: int, label: str, bench: Any) -> dict[str, Any] | None:
    """``label``'s outputs against the baseline's at one level, request by request within each repeat."""
    pairs = []
    for repeat in range(bench.repeats):
        base = next((r for r in runs if r["label"] == "baseline" and r["concurrency"] == level and r["repeat"] == repeat), None)
        arm = next((r for r in runs if r["label"] == label and r["concurrency"] == level and r["repeat"] == repeat), None)
        if base and arm:
            pairs.append((base["_records"], arm["_records"]))
    return M.lossless(pairs, bench.temperature) if pairs else None


def _write(path: Path, report: dict[str, Any], records: list[dict[str, Any]], plots: bool) -> dict[str, str]:
    files = {"report_json": str(path / "report.json"), "report_md": str(path / "report.md"),
             "requests_jsonl": str(path / "requests.jsonl")}
    with open(path / "requests.jsonl", "w", encoding="utf-8") as fh:
        for row in records:
            fh.write(json.dumps(row) + "\n")
    if plots:
        files.update({f"plot_{k}": v for k, v in write_plots(report, path).items()})
    report["files"] = files
    (path / "report.md").write_text(render_markdown(report), encoding="utf-8")
    return files
