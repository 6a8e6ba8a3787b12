"""The `tune` stage: measure acceptance and step costs, predict, check, and choose the draft shape.

convert/ + recipe `tune` -> <workdir>/tune/ (report.json, report.md, tune.png, manifest.json).
The manifest holds what was measured (``measured``: tokens/s per draft length and concurrency)
and the choice made from it; `build` makes the choice again for its own settings and writes each
engine's form (``tuning.forms``). The report shows those forms as build would write them now.

What is measured, on the recipe's runtime:
- the head's per-position acceptance on the tune prompts (chain of the longest length K);
- the wall time of one decoding step with k drafted tokens, k = 0..K, at each level of
  `tune.concurrency` — every candidate length really runs, interleaved prompt by prompt
  (k order rotating) so machine drift hits every candidate alike.
From those, `tuning.model` predicts tokens/s per (k, concurrency); the measured tokens/s
of the same runs decides, and the predicted vs measured table goes into the report.

The reference runtime serves one request at a time: a step advances one request at any
concurrency, so its measured cost at concurrency 1 stands for every level (said in the
report). Engines that batch (vLLM, TensorRT-LLM) are measured per level by their own runner;
TensorRT-LLM's (``tuning.trtllm``) needs the package and trtllm-serve installed, and without
them tune stops (exit 3) before anything is measured or written.

Free speculation: where ``bench.baselines`` lists ``ngram`` and tune runs on vLLM, one more server serves the
target with n-gram prompt lookup (no head, ``bench.ngram``'s window), measured at every level beside the
candidates and compared with plain decoding like them. Where it beats the head's best choice by more than
``tune.margin`` at every level, the bundle serves it (``tuning.forms.decide``); the report says so either way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import output
from ..errors import CheckFailed, ExternalFailure, InputError
from ..manifest import canonical_hash, compute_fingerprint, manifest_hash, stage_dir, up_to_date, write_json_atomic
from ..tuning import forms
from ..tuning import model as M
from ..tuning.measure import (DRAFTER_IDLE, NGRAM, Measured, measure_reference, measure_vllm, per_position,
                              server_label, vllm_launch)
from .outputs import read_convert, tune_dir

STAGE = "tune"
REPORT_SCHEMA_VERSION = 1


@dataclass
class TuneResult:
    manifest: dict[str, Any]
    skipped: bool


def candidate_lengths(recipe: Any) -> list[int]:
    top = recipe.tune.max_draft_len or recipe.build.max_draft_len
    return list(range(0, top + 1))


def levels(recipe: Any) -> list[int]:
    found = sorted(set(recipe.tune.concurrency or recipe.bench.concurrency) | {1})
    return found


# --- measuring on the recipe's runtime -----------------------------------------------------------


def _samples(recipe: Any) -> list[dict[str, Any]]:
    from ..prompts import load_samples

    tune = recipe.tune
    return load_samples(tune.prompts or recipe.bench.prompts, "tune.prompts", recipe.base_dir)[: tune.num_prompts]


def _reference_runs(recipe: Any, convert: dict[str, Any], lengths: list[int]) -> dict[int, Measured]:
    from ..reference.decoder import ReferenceDecoder
    from ..training.data import prompt_ids

    tune = recipe.tune
    decoder = ReferenceDecoder.from_convert_manifest(convert, device=recipe.runtime.device)
    encoded = [prompt_ids(s, decoder.tokenizer) for s in _samples(recipe)]
    output.log(f"tune: {len(encoded)} prompts x draft lengths {lengths} on the reference decoder, {tune.max_tokens} tokens each")
    with output.progress() as bar:
        task = bar.add_task("tune: decoding", total=len(encoded) * len(lengths))
        return measure_reference(decoder, encoded, lengths, tune.max_tokens, on_run=lambda: bar.advance(task))


def _trtllm_runs(recipe: Any, convert: dict[str, Any], installed: Any, lengths: list[int], lvls: list[int],
                 scratch: Path) -> tuple[dict[tuple[int, int], Measured], list[dict[str, Any]]]:
    """One trtllm-serve per candidate length, one after another (``tuning.trtllm``)."""
    from ..tuning import trtllm

    tune = recipe.tune
    samples = _samples(recipe)
    count = max(len(samples), 2 * max(lvls))  # every level keeps its requests in flight for a while
    # a run takes at most a prefill and max_tokens iterations per request: the stats buffer keeps them all
    options = trtllm.write_candidates(recipe, convert, installed.version, lengths, scratch / "trtllm-options",
                                      iterations=count * (tune.max_tokens + 1))
    payloads = []
    for i in range(count):
        sample = samples[i % len(samples)]
        body = {k: sample[k] for k in ("messages", "prompt") if k in sample} or {"prompt": sample.get("text", "")}
        payloads.append({**body, "max_tokens": tune.max_tokens, "temperature": 0.0, "stream": True})
    output.log(f"tune: trtllm-serve ({installed.version}) for draft lengths {lengths}, one server at a time; "
               f"{count} requests x {tune.max_tokens} tokens at concurrency {lvls}")
    with output.progress() as bar:
        task = bar.add_task("tune: trtllm-serve runs", total=len(lengths) * len(lvls) * tune.repeats)
        return trtllm.measure_trtllm(installed, convert["artifacts"]["target_dir"], recipe.build, options, payloads,
                                     lvls, scratch, tune.startup_timeout_s, tune.run_timeout_s, repeats=tune.repeats,
                                     on_run=lambda: bar.advance(task),
                                     compare=recipe.serve_test.lossless.mode != "off")


def _vllm_runs(recipe: Any, recipe_path: Path, convert: dict[str, Any], lengths: list[int], lvls: list[int],
               scratch: Path) -> tuple[dict[tuple[int, int], Measured], list[dict[str, Any]], Any]:
    """One vLLM server per candidate length on a draft overlay of tune's own; runs interleaved when RAM (on CUDA:
    the GPUs) holds every server (``runtime.vllm_servers``, ``backends.vllm.placement``), else one server or one
    wave at a time. Returns (runs, servers, placement)."""
    from ..backends import launch
    from ..backends.vllm import launch as vllm, placement as placing

    tune = recipe.tune
    artifacts = convert["artifacts"]
    aux = [int(i) for i in convert["decisions"]["aux_layer_ids"]]
    python = vllm.find_python(recipe.runtime, vllm.project_roots(recipe_path))
    overlay = scratch / "vllm-draft"
    launch.write_draft_overlay(Path(artifacts["draft_dir"]), overlay, launch.vllm_overlay_update(aux))
    # DRAFTER_IDLE: what a 0 in vLLM's schedule really costs (the drafter still runs each step)
    values = vllm.launch_values(recipe.runtime, *vllm.launch_device(recipe.runtime, vllm.is_cpu_build(python)))
    extra = [DRAFTER_IDLE] + ([NGRAM] if "ngram" in recipe.bench.baselines else [])
    keys = sorted([*lengths, *extra], key=lambda k: k == 0)  # plain decoding's server in the last wave
    placement = placing.place([server_label(k) for k in keys], recipe.runtime, recipe.build, values,
                              [artifacts["target_dir"], artifacts["draft_dir"]])
    launches = {k: vllm_launch(python, artifacts["target_dir"], str(overlay), recipe.build, recipe.runtime, recipe.name, k,
                               values, placement, recipe.bench.ngram)
                for k in [*lengths, *extra]}
    samples = _samples(recipe)
    count = max(len(samples), 2 * max(lvls))  # every level keeps its requests in flight for a while
    payloads = []
    for i in range(count):
        sample = samples[i % len(samples)]
        body = {k: sample[k] for k in ("messages", "prompt") if k in sample} or {"prompt": sample.get("text", "")}
        payloads.append({**body, "max_tokens": tune.max_tokens, "temperature": 0.0, "stream": True,
                         "stream_options": {"include_usage": True}, **vllm.REQUEST_EXTRA})
    together = placement.together
    if not together and recipe.runtime.vllm_servers == "auto":
        output.warn(f"tune: {placement.why}: the vLLM servers run {placement.mode}, so drift between the candidates is "
                    "not cancelled (runtime.vllm_servers: together forces them up at once)")
    output.log(f"tune: vLLM servers for draft lengths {lengths}, a drafter scheduled to 0"
               + (" and n-gram prompt lookup (bench.baselines)" if NGRAM in launches else "")
               + f"; {count} requests x {tune.max_tokens} tokens "
               f"at concurrency {lvls}, " + ("interleaved" if together else f"{placement.mode}") + f" ({placement.why})")
    by_label = {server_label(k): k for k in keys}
    with output.progress() as bar:
        task = bar.add_task("tune: vLLM runs", total=len(launches) * len(lvls) * tune.repeats)
        lossless = recipe.serve_test.lossless  # serve-test's tie rule: `off` compares nothing, here too
        runs, servers = measure_vllm(launches, payloads, lvls, scratch, tune.startup_timeout_s, tune.run_timeout_s,
                                     repeats=tune.repeats, on_run=lambda: bar.advance(task), together=together,
                                     tie_margin=None if lossless.mode == "off" else lossless.tie_margin,
                                     waves=[[by_label[label] for label in wave] for wave in placement.waves])
    return runs, servers, placement


# --- the decision ------------------------------------------------------------------------------


def decide(runs: dict[tuple[int, int], Measured], acceptance: list[float], margin: float,
           requests_per_step: dict[int, float] | None) -> dict[str, Any]:
    """Predicted vs measured table and the choice the prediction alone would make (the measured choice:
    ``tuning.forms.decide``).

    The prediction uses only what a user could measure cheaply: per-position acceptance of the
    longest chain, and step costs of plain decoding and of the longest chain, interpolated in
    between (``tuning.model.interpolate_step_costs``). Every candidate also really ran; the
    measured tokens/s decides.
    """
    lengths = sorted({k for k, _ in runs})
    top = max(lengths)
    step_s = {}
    for b in sorted({b for _, b in runs}):
        plain, full = runs.get((0, b)), runs.get((top, b))
        # no prediction without per-position acceptance of the longest chain (TensorRT-LLM serves none)
        if plain and full and plain.steps and full.steps and top > 0 and len(acceptance) >= top:
            costs = M.interpolate_step_costs(plain.step_s, full.step_s, top)
            step_s.update({(k, b): costs[k] for k in lengths})
    predicted = {(p.draft_len, p.concurrency): p for p in M.predict(acceptance, step_s, requests_per_step)}
    # A run's tokens/s is the whole engine's at that level (for the one-at-a-time reference
    # server, the single stream's is the engine's at every level).
    measured_rates = {key: m.tokens_per_second for key, m in runs.items()}
    rows = []
    for (k, b), m in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        p = predicted.get((k, b))
        rows.append({"concurrency": b, "draft_len": k,
                     "predicted_tokens_per_second": round(p.tokens_per_second, 3) if p else None,
                     "measured_tokens_per_second": round(measured_rates[(k, b)], 3),
                     "predicted_tokens_per_step": round(p.tokens_per_step, 4) if p else None,
                     "measured_tokens_per_step": round(m.acceptance_length, 4) if m.acceptance_length else None,
                     "step_s": round(m.step_s, 6), "identical_to_plain": m.identical_to_plain,
                     "failed_requests": m.failed_requests})
    predicted_choice = M.best_per_level({key: p.tokens_per_second for key, p in predicted.items()}, margin)
    return {"rows": rows, "predicted_choice": predicted_choice, "measured_rates": measured_rates}


def engine_forms_preview(recipe: Any, decision: forms.Decision) -> dict[str, Any]:
    """Each engine's form of ``decision`` as build would write it with this recipe now (build derives it again)."""
    from ..backends.trtllm import versions

    target = versions.resolve(recipe.runtime.trtllm_version)
    return forms.engine_forms(decision, target.version, recipe.build.max_batch_size, recipe.tune.trtllm_allow_zero)


def fingerprint_inputs(recipe: Any, convert: dict[str, Any], engine_version: str | None = None) -> dict[str, Any]:
    """What the measurement depends on: the recipe minus the keys that change no measurement (where servers
    listen, which TensorRT-LLM build writes for, the margin and floor build applies, plots), the prompts by
    content (not path), the convert it ran on, and the engine release it ran on where that is known
    (``engine_version``: the installed TensorRT-LLM)."""
    sections = recipe.section("tune", "build", "runtime")
    for section, keys in (("runtime", ("host", "port", "trtllm_version")),
                          ("tune", ("margin", "trtllm_allow_zero", "plots", "prompts"))):
        for key in keys:
            sections[section].pop(key, None)
    lossless = recipe.serve_test.lossless  # decides whether tune passes and what it reports
    sections["lossless"] = {"mode": lossless.mode, "tie_margin": lossless.tie_margin}
    inputs = {"recipe": sections, "prompts": canonical_hash(_samples(recipe)), "levels": levels(recipe),
              "lengths": candidate_lengths(recipe), "convert_manifest": manifest_hash(convert)}
    if "ngram" in recipe.bench.baselines and recipe.runtime.backend == "vllm":  # absent: earlier fingerprints hold
        inputs["ngram"] = free_settings(recipe)
    if engine_version is not None:
        inputs["engine_version"] = engine_version
    return inputs


def free_settings(recipe: Any) -> dict[str, Any]:
    """The n-gram arm's vLLM settings (what tune measures and a bundle serving it repeats)."""
    from ..backends.vllm.launch import free_config, free_draft_len

    config = free_config("ngram", free_draft_len(recipe.build, recipe.bench.ngram), recipe.bench.ngram)
    return {key: config[key] for key in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")}


def _length(k: int) -> str:
    return {DRAFTER_IDLE: "0 (drafter idle)", NGRAM: "n-gram (no head)"}.get(k, str(k))


def lossless_verdict(recipe: Any, runs: dict[tuple[int, int], Measured]) -> dict[str, Any]:
    """Greedy output against plain decoding's, with serve-test's tie rule (``serve_test.lossless``): a difference
    whose plain run led by less than ``tie_margin`` nats is a numerical tie, logged and reported, failing only in
    ``strict`` mode; any other difference fails (:class:`CheckFailed`). ``off``: nothing is compared."""
    spec = recipe.serve_test.lossless
    if spec.mode == "off":
        for m in runs.values():
            m.identical_to_plain = None
        return {"mode": "off", "compared": False, "numerical_ties": 0, "ties": []}
    ties = [{"draft_len": k, "concurrency": b, **t} for (k, b), m in sorted(runs.items()) for t in m.ties]
    if ties:
        shown = "; ".join(f"draft length {_length(t['draft_len'])} prompt {t['prompt']} token {t['position']}: "
                          f"{t['margin']:g} nats" for t in ties[:5]) + ("; ..." if len(ties) > 5 else "")
        output.log(f"tune: {len(ties)} difference(s) from plain decoding at a numerical tie (the plain run's lead "
                   f"< serve_test.lossless.tie_margin {spec.tie_margin:g} nats"
                   + (", which fails in strict mode" if spec.mode == "strict" else ", counted as equal") + f"): {shown}")
    diverged = sorted((k, b) for (k, b), m in runs.items() if m.first_divergence is not None
                      or m.identical_to_plain is False and not m.ties)
    if diverged:
        k, b = diverged[0]
        where = runs[(k, b)].first_divergence or {}
        diag = where.get("diagnosis") or {}
        why = ""
        if diag.get("class") == "divergence" and diag.get("margin") is not None:
            why = f"; the plain run led by {diag['margin']:g} nats there, at least the tie margin {spec.tie_margin:g}"
        elif diag:
            why = f"; not diagnosed as a tie: {diag.get('note') or diag.get('class')}"
        raise CheckFailed(f"tune: draft length {_length(k)}, concurrency {b}: "
                          f"the greedy output differs from plain decoding's on prompt {where.get('prompt')} at "
                          f"output token {where.get('position')} (greedy must be lossless{why})",
                          fix="run `specconvert serve-test RECIPE` to find the first divergence")
    if ties and spec.mode == "strict":
        t = ties[0]
        raise CheckFailed(f"tune: draft length {_length(t['draft_len'])}, concurrency {t['concurrency']}: the greedy "
                          f"output differs from plain decoding's on prompt {t['prompt']} at output token {t['position']}, "
                          f"a numerical tie ({t['margin']:g} nats < {spec.tie_margin:g}) that fails in strict mode",
                          fix="set serve_test.lossless.mode: greedy to count numerical ties as equal")
    compared = sorted({k for (k, _), m in runs.items() if k != 0 and m.identical_to_plain is not None})
    if not compared:  # asked for, so it cannot pass on nothing
        raise CheckFailed(f"tune: serve_test.lossless.mode is {spec.mode} but no draft length's output could be "
                          "compared with plain decoding's (no request gave output on both sides at concurrency 1)",
                          fix="see the server logs in the tune directory; set serve_test.lossless.mode: off to "
                              "measure without the lossless check")
    return {"mode": spec.mode, "compared": True, "compared_draft_lengths": compared, "tie_margin": spec.tie_margin,
            "numerical_ties": len(ties), "ties": ties}


def verdict_lines(choice: dict[int, int], lengths: list[int], rates: dict[tuple[int, int], float]) -> list[str]:
    """Plain sentences: where speculation pays, where it does not."""
    lines = []
    for b, k in sorted(choice.items()):
        base = rates.get((0, b))
        best = rates.get((k, b))
        if k == 0:
            longest = max(lengths)
            ratio = rates.get((longest, b), 0) / base if base else 0
            lines.append(f"concurrency {b}: speculation does not pay on this hardware with this head "
                         f"(chain {longest} measured {ratio:.2f}x plain): draft length 0")
        else:
            lines.append(f"concurrency {b}: draft length {k}, {best / base:.2f}x plain" if base else
                         f"concurrency {b}: draft length {k}")
    return lines


def run(recipe: Any, force: bool = False, recipe_path: Path | None = None, verify: bool = False) -> TuneResult:
    """Tune (or keep, when unchanged) ``<workdir>/tune/``; return its manifest. ``verify``: hash every sealed file."""
    from ..workdir import workdir_lock

    with workdir_lock(recipe.workdir_path):
        return _run(recipe, force, recipe_path, verify)


def _run(recipe: Any, force: bool, recipe_path: Path | None, verify: bool = False) -> TuneResult:
    convert = read_convert(recipe, verify=verify)
    backend = recipe.runtime.backend
    if backend not in ("reference", "vllm", "trtllm"):
        raise InputError(f"runtime.backend: tune measures on the reference decoder, vLLM or TensorRT-LLM, not {backend!r}",
                         fix="run `specconvert tune RECIPE --set runtime.backend=reference` (or vllm, trtllm); the "
                             "chosen schedule is written for every engine")
    installed = None
    if backend == "trtllm":  # exit 3 with the install route before anything is measured or written
        from ..tuning.trtllm import require_installed

        installed = require_installed()
    lengths = candidate_lengths(recipe)
    lvls = levels(recipe)
    final = tune_dir(recipe)
    inputs = fingerprint_inputs(recipe, convert, installed.version if installed else None)
    if not force:
        existing = up_to_date(final, compute_fingerprint(STAGE, inputs))
        if existing is not None:
            output.log(f"tune: {final} is up to date (use --force to measure again)")
            return TuneResult(existing, skipped=True)

    if "ngram" in recipe.bench.baselines and backend != "vllm":
        output.log(f"tune: bench.baselines lists ngram, but tune measures n-gram on vLLM only: not a candidate on "
                   f"{backend} (bench puts it beside the head)")
    t0 = time.perf_counter()
    top = max(lengths)
    servers: list[dict[str, Any]] = []
    placement = None
    with stage_dir(final, STAGE, inputs) as stage:
        if backend == "trtllm":
            runs, servers = _trtllm_runs(recipe, convert, installed, lengths, lvls, stage.path)
            serial = None
            note = (f"TensorRT-LLM {installed.version} batches: each candidate length has its own trtllm-serve, "
                    "measured at every level, one server at a time (each takes its KV-cache share of the GPU up "
                    "front), so drift between candidates is not cancelled. trtllm-serve serves no per-position "
                    "acceptance: nothing is predicted from it, the measured tokens/s decide")
        elif backend == "vllm":
            runs, servers, placement = _vllm_runs(recipe, recipe_path or recipe.base_dir / "recipe.yaml", convert,
                                                  lengths, lvls, stage.path)
            serial = None
            note = ("vLLM batches: each candidate length has its own server, measured at every level, "
                    + ("runs interleaved across servers" if placement.together else
                       ("one server at a time" if placement.mode == "sequential" else placement.mode)
                       + f" ({placement.why}): drift between candidates is not cancelled"))
        else:
            measured = _reference_runs(recipe, convert, lengths)
            # One request per step at any concurrency: the level-1 measurement stands for every level.
            runs = {(k, b): m for k, m in measured.items() for b in lvls}
            serial = {b: 1 for b in lvls}
            note = "the reference server serves one request at a time: each level's cost is concurrency 1's"
        for server in servers:  # files written while staging end up in tune/
            for key in ("log", "options"):
                if isinstance(server.get(key), str):
                    server[key] = server[key].replace(str(stage.path), str(final))
        idle = {b: m for (k, b), m in runs.items() if k == DRAFTER_IDLE}
        ngram = {b: m for (k, b), m in runs.items() if k == NGRAM}
        if any(m.failed_requests for m in runs.values()):
            bad = sum(m.failed_requests for m in runs.values())
            raise ExternalFailure(f"tune: {bad} requests failed while measuring", fix=f"see the server logs in {final}")
        lossless = lossless_verdict(recipe, runs)
        runs = {key: m for key, m in runs.items() if key[0] not in (DRAFTER_IDLE, NGRAM)}
        longest = [m for (k, _), m in runs.items() if k == top]
        acceptance = [sum(p) / len(longest) for p in zip(*(per_position(m) for m in longest))] if longest else []
        decision = decide(runs, acceptance, recipe.tune.margin, serial)
        idle_rates = {b: m.tokens_per_second for b, m in idle.items()}
        measured = forms.Measurement(decision["measured_rates"], idle_rates,
                                     {"ngram": {b: m.tokens_per_second for b, m in ngram.items()}} if ngram else {},
                                     {"ngram": free_settings(recipe)} if ngram else {})
        chosen = forms.decide(measured, recipe.tune.margin, recipe.bench.baselines)
        v_choice = chosen.vllm_choice
        preview = engine_forms_preview(recipe, chosen)
        lines = verdict_lines(chosen.choice, lengths, decision["measured_rates"])
        for b, k in sorted(v_choice.items()):
            if b in idle_rates and chosen.choice[b] == 0 and v_choice != chosen.choice:
                base = decision["measured_rates"].get((0, b)) or 0
                rate = idle_rates[b] if k == 0 else decision["measured_rates"][(k, b)]
                lines.append(f"vLLM, concurrency {b}: a 0 in its schedule still runs the drafter "
                             f"({idle_rates[b] / base:.2f}x plain measured); the schedule drafts {k} there "
                             f"({rate / base:.2f}x plain), the best a speculative vLLM server does" if base else
                             f"vLLM, concurrency {b}: the schedule drafts {k}")
        lines += chosen.free_notes
        if ngram and not chosen.free_choice:
            lines.append("n-gram prompt lookup (bench.baselines) measured below the head's choice at every "
                         "concurrency: " + ", ".join(f"{b}: {m.tokens_per_second / decision['measured_rates'][(0, b)]:.2f}x "
                                                     "plain" for b, m in sorted(ngram.items())
                                                     if decision["measured_rates"].get((0, b))))
        for line in lines:
            output.log(f"tune: {line}")
        report = {
            "schema_version": REPORT_SCHEMA_VERSION,
            "runtime": backend,
            "runtime_note": note,
            "candidates": lengths,
            "concurrency": lvls,
            "margin": recipe.tune.margin,
            "lossless": lossless,
            "per_position_acceptance": [round(p, 4) for p in acceptance],
            "acceptance_sources": {f"{k}@{b}": m.as_dict()["acceptance_source"] for (k, b), m in sorted(runs.items())
                                   if m.acceptance_sources} or None,
            "measurements": [m.as_dict() for m in runs.values()],
            "table": decision["rows"],
            "choice": {str(b): k for b, k in chosen.choice.items()},
            "vllm_choice": {str(b): k for b, k in v_choice.items()} if idle else None,
            "vllm_drafter_idle": ({str(b): m.as_dict() for b, m in idle.items()} if idle else None),
            "free_speculation": ({"ngram": {"settings": free_settings(recipe),
                                            "runs": {str(b): m.as_dict() for b, m in sorted(ngram.items())},
                                            "chosen_at": sorted(b for b, how in chosen.free_choice.items()
                                                                if how == "ngram"),
                                            "served": chosen.served == "ngram"}} if ngram else None),
            "served": chosen.served,
            "predicted_choice": {str(b): k for b, k in decision["predicted_choice"].items()},
            "segments": [s.as_dict() for s in chosen.segments],
            "measured": measured.as_dict(),
            "engine_forms_preview": preview,
            "verdict": lines,
            "servers": servers,
            "placement": placement.as_dict() if placement is not None else None,
            "tune_s": round(time.perf_counter() - t0, 2),
        }
        write_json_atomic(stage.path / "report.json", report)
        (stage.path / "report.md").write_text(render_markdown(report), encoding="utf-8")
        if recipe.tune.plots:
            _plot(report, stage.path / "tune.png")
        stage.finish(measured=report["measured"], margin=recipe.tune.margin, segments=report["segments"], served=chosen.served,
                     choice=report["choice"], vllm_choice=report["vllm_choice"],
                     per_position_acceptance=report["per_position_acceptance"], verdict=lines,
                     timings={"tune_s": report["tune_s"]})
    return TuneResult(stage.manifest, skipped=False)


def render_markdown(report: dict[str, Any]) -> str:
    out = [f"# specconvert tune ({report['runtime']})", "",
           f"Per-position acceptance (chain {max(report['candidates'])}): {report['per_position_acceptance']}", "",
           f"Note: {report['runtime_note']}", ""]
    if report.get("acceptance_sources"):
        out += ["Acceptance source per draft length @ concurrency (the engine's own; `estimated` = stream chunks, "
                "`unavailable` = nothing served it):", ""]
        out += [f"- {key}: {source}" for key, source in report["acceptance_sources"].items()] + [""]
    out += ["| concurrency | draft length | predicted tok/s | measured tok/s | predicted tokens/step | measured tokens/step "
            "| step ms |", "|---|---|---|---|---|---|---|"]
    for r in report["table"]:
        out.append(f"| {r['concurrency']} | {r['draft_len']} | {r['predicted_tokens_per_second']} | "
                   f"{r['measured_tokens_per_second']} | {r['predicted_tokens_per_step']} | "
                   f"{r['measured_tokens_per_step']} | {r['step_s'] * 1000:.1f} |")
    idle = report.get("vllm_drafter_idle")
    if idle:
        out += ["", "vLLM with the drafter loaded and its schedule at 0 (what a 0 in `num_speculative_tokens_per_batch_size` "
                "costs: the drafter still runs each step): "
                + ", ".join(f"concurrency {b}: {m['tokens_per_second']} tok/s" for b, m in idle.items())]
    free = (report.get("free_speculation") or {}).get("ngram")
    if free:
        out += ["", f"n-gram prompt lookup (no head, bench.baselines; vLLM {free['settings']}): "
                + ", ".join(f"concurrency {b}: {m['tokens_per_second']} tok/s, {m['acceptance_length']} tokens/step, "
                            f"identical to plain: {m['identical_to_plain']}" for b, m in free["runs"].items())
                + (". The bundle serves it." if free["served"] else
                   f". Best at concurrency {free['chosen_at']}." if free["chosen_at"] else ".")]
    lossless = report.get("lossless") or {}
    if lossless.get("numerical_ties"):
        out += ["", f"Lossless: {lossless['numerical_ties']} difference(s) from plain decoding at a numerical tie "
                f"(the plain run's lead < {lossless['tie_margin']:g} nats, `serve_test.lossless.tie_margin`): "
                + "; ".join(f"draft length {t['draft_len']}, prompt {t['prompt']}, token {t['position']}: "
                            f"{t['margin']:g} nats" for t in lossless["ties"])]
    elif lossless.get("compared") is False:
        out += ["", "Lossless: not compared (`serve_test.lossless.mode: off`)"]
    out += ["", "## Choice", ""] + [f"- {line}" for line in report["verdict"]]
    out += ["", "## Each engine's schedule, as `build` derives it with this recipe now", "",
            "build makes the choice again from the measurements above, with its own settings (the TensorRT-LLM "
            "version it builds for, `tune.margin`, `tune.trtllm_allow_zero`, `build.max_batch_size`).", ""]
    for engine, s in report["engine_forms_preview"].items():
        shown = {k: v for k, v in s.items() if k != "notes"}
        out.append(f"- **{engine}**: `{shown}`")
        out += [f"  - {n}" for n in s.get("notes", [])]
    return "\n".join(out) + "\n"


def _plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for b in report["concurrency"]:
        rows = [r for r in report["table"] if r["concurrency"] == b]
        ks = [r["draft_len"] for r in rows]
        ax.plot(ks, [r["measured_tokens_per_second"] for r in rows], "o-", label=f"measured, concurrency {b}")
        ax.plot(ks, [r["predicted_tokens_per_second"] for r in rows], "x--", label=f"predicted, concurrency {b}")
        free = ((report.get("free_speculation") or {}).get("ngram") or {}).get("runs", {}).get(str(b))
        if free:  # no draft length of its own: a level across the chart
            ax.axhline(free["tokens_per_second"], linestyle=":", color=ax.lines[-1].get_color(),
                       label=f"n-gram (no head), concurrency {b}")
    ax.set_xlabel("draft length (0 = no speculation)")
    ax.set_ylabel("tokens/s")
    ax.set_title("specconvert tune")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
