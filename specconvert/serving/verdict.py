"""serve-test's verdict: compare speculative with baseline output, aggregate tau, decide every check.

Pure functions of what the requests gave (no servers, no I/O): the per-prompt rows of
``report.json``, the checks, the summary, and the JUnit suites.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from . import junit
from .client import Completion
from .metrics import aggregate

SPECULATIVE, BASELINE = "speculative", "baseline"
CONTINUATION_TOKENS = 8
CONTINUATION_CHARS = 40


@dataclass
class Outcome:
    """What one (label, prompt, streamed?) request gave."""

    completion: Completion | None = None
    error: str | None = None
    error_kind: str | None = None
    stats: dict[str, Any] | None = None
    diagnosis: dict[str, Any] | None = None  # baseline only: the first divergence's logprob margin (tie or not)


def first_divergence(spec: Completion, base: Completion) -> dict[str, Any] | None:
    """Where two outputs first differ: token index (when both carry ids) and character index, with continuations."""
    out: dict[str, Any] = {}
    if spec.token_ids is not None and base.token_ids is not None:
        if spec.token_ids == base.token_ids:
            return None
        i = next((k for k, (a, b) in enumerate(zip(spec.token_ids, base.token_ids)) if a != b),
                 min(len(spec.token_ids), len(base.token_ids)))
        out.update(token_index=i, speculative_tokens=spec.token_ids[i:i + CONTINUATION_TOKENS],
                   baseline_tokens=base.token_ids[i:i + CONTINUATION_TOKENS])
    elif spec.text == base.text:
        return None
    c = next((k for k, (a, b) in enumerate(zip(spec.text, base.text)) if a != b), min(len(spec.text), len(base.text)))
    out.update(char_index=c, speculative_text=spec.text[c:c + CONTINUATION_CHARS],
               baseline_text=base.text[c:c + CONTINUATION_CHARS])
    return out


def _same(a: Completion, b: Completion) -> bool:
    if a.token_ids is not None and b.token_ids is not None:
        return a.token_ids == b.token_ids and a.text == b.text
    return a.text == b.text


def _describe_divergence(div: dict[str, Any]) -> str:
    if "token_index" in div:
        text = (f"first divergence at token {div['token_index']}: speculative {div['speculative_tokens']} "
                f"{div.get('speculative_text', '')!r} vs baseline {div['baseline_tokens']} {div.get('baseline_text', '')!r}")
    else:
        text = f"first divergence at character {div['char_index']}: {div['speculative_text']!r} vs {div['baseline_text']!r}"
    diag = div.get("diagnosis")
    if diag:
        margin = diag.get("margin")
        kind = {"tie": "numerical tie", "divergence": "real divergence"}.get(diag.get("class"), "not diagnosed")
        text += f" [{kind}" + (f": baseline leads by {margin:g} nats, tie below {diag.get('tie_margin'):g}"
                               if margin is not None and diag.get("tie_margin") is not None else "")
        text += (f"; {diag['note']}" if diag.get("note") else "") + "]"
    return text


def _latency(values: list[float]) -> dict[str, Any] | None:
    if not values:
        return None
    ordered = sorted(values)
    return {"mean_s": round(statistics.fmean(values), 4), "p50_s": round(statistics.median(values), 4),
            "max_s": round(ordered[-1], 4), "n": len(values)}


@dataclass
class _Tally:
    """What the per-prompt comparison counts for the checks and the summary."""

    matches: int = 0
    ties: int = 0
    stream_ok: int = 0
    stream_total: int = 0


class _Checks:
    """The run's checks, in order, each also a JUnit case."""

    def __init__(self, suite: junit.Suite):
        self.suite = suite
        self.items: list[dict[str, Any]] = []

    def add(self, name: str, passed: bool | None, value: Any, threshold: Any, message: str, fix: str | None = None,
            error: bool = False) -> None:
        """``passed=None``: skipped, nothing to judge (it neither passes nor fails the run)."""
        self.items.append({"name": name, "passed": passed, "value": value, "threshold": threshold, "message": message,
                           **({"skipped": True} if passed is None else {}), **({"fix": fix} if fix else {})})
        status = "skipped" if passed is None else "passed" if passed else ("error" if error else "failed")
        self.suite.add(junit.Case(name, "serve-test.checks", 0.0, status, message,
                                  message + (f"\nFix: {fix}" if fix else "")))


def evaluate(run: Any) -> dict[str, Any]:
    """Per-prompt comparison, the checks, the summary (report.json body) and the JUnit suites of a finished run
    (``run``: a ``stages.serve_test.ServeRun``: spec, prompts, results, servers, metrics_available)."""
    spec = run.spec
    suites = [junit.Suite("serve-test.checks"), junit.Suite("serve-test.prompts")]
    checks = _Checks(suites[0])
    tally, rows, stats = _Tally(), [], []
    by_category: dict[str, list[dict[str, Any]]] = {}
    for prompt in run.prompts:
        before = len(stats)
        row, streamed_pair = _prompt_row(run, prompt, tally, stats)
        if getattr(prompt, "category", None) is not None:
            row["category"] = prompt.category
            by_category.setdefault(prompt.category, []).extend(stats[before:])
        _add_prompt_case(suites[1], row, spec, streamed_pair)
        rows.append(row)
    _server_checks(checks, run.servers, spec)
    _lossless_check(checks, spec, rows, tally, len(run.prompts))
    overall, tau, measured = _acceptance_check(checks, run, spec, stats)
    categories = _category_checks(checks, run, spec, by_category)
    _oracle_check(checks, getattr(run, "oracle", None))
    if spec.stream:
        checks.add("streaming equals non-streaming", tally.stream_total > 0 and tally.stream_ok == tally.stream_total,
                   tally.stream_ok, tally.stream_total,
                   f"{tally.stream_ok}/{tally.stream_total} streamed speculative outputs equal the non-streamed ones")
    startup_failed = any(c["name"].startswith("server startup") and not c["passed"] for c in checks.items)
    status = ("error" if startup_failed else
              "passed" if all(c["passed"] is not False for c in checks.items) else "failed")
    summary = _summary(rows, tally, len(run.prompts), overall, tau, measured)
    if categories:
        summary["acceptance_per_category"] = categories
    return {"status": status, "summary": summary, "checks": checks.items, "prompts": rows, "junit": suites}


def _prompt_row(run: Any, prompt: Any, tally: _Tally, stats: list[dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """One prompt's speculative, baseline and streamed outcomes compared (``report.json`` ``prompts[]``), and
    whether both a streamed and a non-streamed speculative output exist to compare."""
    spec = run.spec
    lossless_on = spec.lossless.mode != "off"
    s = run.results.get((SPECULATIVE, prompt.id, False)) or Outcome(error="not run", error_kind="skipped")
    b = (run.results.get((BASELINE, prompt.id, False)) or Outcome(error="not run", error_kind="skipped")
         if lossless_on else Outcome())  # lossless off: no baseline was asked, nothing missing
    st = run.results.get((SPECULATIVE, prompt.id, True)) if spec.stream else None
    errors = [f"{name}: {o.error}" for name, o in ((SPECULATIVE, s), (BASELINE, b), ("speculative stream", st))
              if o is not None and o.error]
    row: dict[str, Any] = {"id": prompt.id, "errors": errors, "exact_match": False, "first_divergence": None,
                           "stream_matches": None, "acceptance_length": None, "per_position_acceptance": None,
                           "latency_s": {}, "ttft_s": {}, "completion_tokens": {}}
    for name, o in ((SPECULATIVE, s), (BASELINE, b), ("speculative_stream", st)):
        if o is not None and o.completion:
            row["latency_s"][name] = round(o.completion.latency_s, 4)
            row["ttft_s"][name] = None if o.completion.ttft_s is None else round(o.completion.ttft_s, 4)
            row["completion_tokens"][name] = (len(o.completion.token_ids) if o.completion.token_ids is not None
                                              else o.completion.completion_tokens)
    if s.completion and b.completion:
        div = first_divergence(s.completion, b.completion)
        row["exact_match"] = div is None
        row["first_divergence"] = div
        if div is not None and b.diagnosis:
            div["diagnosis"] = b.diagnosis
        tie = div is not None and (b.diagnosis or {}).get("class") == "tie"
        row["numerical_tie"] = tie
        tally.ties += tie
        tally.matches += div is None or (tie and spec.lossless.mode != "strict")
    if s.stats:
        stats.append(s.stats)
        row["acceptance_length"] = None if s.stats["acceptance_length"] is None else round(s.stats["acceptance_length"], 4)
        single = aggregate([s.stats])
        row["per_position_acceptance"] = single["per_position_acceptance"] or (
            [round(p, 4) for p in s.stats["per_position"]] if s.stats.get("per_position") else None)
    if st is not None:
        tally.stream_total += 1
        if st.completion and s.completion:
            row["stream_matches"] = _same(st.completion, s.completion)
            tally.stream_ok += row["stream_matches"]
        else:
            row["stream_matches"] = False
    return row, st is not None and bool(st.completion and s.completion)


def _add_prompt_case(suite: junit.Suite, row: dict[str, Any], spec: Any, streamed_pair: bool) -> None:
    """The prompt's JUnit case: passed, failed (a divergence, a streamed mismatch) or error (a failed request)."""
    lossless_on = spec.lossless.mode != "off"
    errors = row["errors"]
    ok = ((row["exact_match"] or row.get("numerical_tie") and spec.lossless.mode != "strict" or not lossless_on)
          and not errors and row["stream_matches"] is not False)
    problems = list(errors)
    if row["first_divergence"]:
        problems.insert(0, _describe_divergence(row["first_divergence"]))
    if streamed_pair and row["stream_matches"] is False:
        problems.append("the streamed output differs from the non-streamed one")
    status = "passed" if ok else ("error" if errors and not row["first_divergence"] else "failed")
    suite.add(junit.Case(f"prompt {row['id']}", "serve-test.prompts", sum(v for v in row["latency_s"].values() if v) or 0.0,
                         status, problems[0] if problems else "", "\n".join(problems)))


def _server_checks(checks: _Checks, servers: list[Any], spec: Any) -> None:
    for server in servers:
        started = server.startup_s is not None
        message = (f"healthy after {server.startup_s} s at {server.url}" if started else (server.error or "did not start"))
        if server.log_tail and not started:
            message += "; last log lines: " + " | ".join(server.log_tail[-5:])
        checks.add(f"server startup: {server.phase}", started, server.startup_s, spec.startup_timeout_s, message,
                   error=not started)
        if started:
            alive = not server.died_mid_run and not server.error
            checks.add(f"server stayed up: {server.phase}", alive, None, None,
                       "answered every request" if alive else server.error
                       + ("; last log lines: " + " | ".join(server.log_tail[-2:]) if server.log_tail else ""))


def _lossless_check(checks: _Checks, spec: Any, rows: list[dict[str, Any]], tally: _Tally, n: int) -> None:
    if spec.lossless.mode == "off":
        return
    fraction = tally.matches / n if n else 0.0
    ties = tally.ties
    checks.add(f"lossless ({spec.lossless.mode}): exact match >= {spec.lossless.min_exact_match:g}",
               n > 0 and fraction >= spec.lossless.min_exact_match, round(fraction, 4), spec.lossless.min_exact_match,
               f"{tally.matches}/{n} prompts: speculative output equals the baseline's"
               + (f" ({ties} at a numerical tie: the baseline's lead < {spec.lossless.tie_margin:g} nats"
                  + (", which fails in strict mode)" if spec.lossless.mode == "strict" else ", counted as equal)")
                  if ties else "")
               + ("" if fraction >= spec.lossless.min_exact_match else
                  "; first mismatch: " + next((f"{r['id']}: " + (_describe_divergence(r["first_divergence"])
                                                                 if r["first_divergence"] else r["errors"][0])
                                               for r in rows if not r["exact_match"]), "")))


def _acceptance_check(checks: _Checks, run: Any, spec: Any, stats: list[dict[str, Any]]
                      ) -> tuple[dict[str, Any], float | None, Any]:
    """The acceptance-length check from the best source there is; returns (per-request aggregate, tau, the
    backend reader's run-level Acceptance or None)."""
    overall = aggregate(stats)
    engine = getattr(run, "engine_acceptance", None) or {}
    counted = engine.get("counters")
    if counted is not None and counted.available and counted.per_position is not None:
        overall["per_position_acceptance"] = [round(p, 4) for p in counted.per_position]
    tau = overall["acceptance_length"]
    name = f"acceptance length >= {spec.min_acceptance_length:g}"
    measured = getattr(run, "acceptance", None)  # run-level Acceptance from the engine backend's reader
    off = getattr(run, "speculation_off", None)
    if off:
        checks.add(name, None, None, spec.min_acceptance_length, f"skipped: {off}")
    elif measured is not None:
        tau = measured.acceptance_length
        if measured.available:
            checks.add(name, tau >= spec.min_acceptance_length, round(tau, 4), spec.min_acceptance_length,
                       f"tau {tau:.4g} ({measured.label})")
        else:
            # Never pass or fail on a number that does not exist: skipped, with every source's reason.
            checks.add(name, None, None, spec.min_acceptance_length, f"not measurable: {measured.reason}",
                       "enable_iter_perf_stats: true (build writes it) gives TensorRT-LLM's specDecodingStats at "
                       "/metrics; or stream at least one request (serve_test.stream: true) for the stream-chunk estimate")
    elif tau is None and counted is not None:
        checks.add(name, False, None, spec.min_acceptance_length,
                   f"the engine's counters gave nothing ({counted.label})",
                   "check that the server runs with a speculative config (engine/vllm/serve.sh) and serves GET /metrics")
    elif tau is None:
        fix = ("the reference server reports acceptance at /perf_metrics; for trtllm-serve run serve-test with "
               "runtime.backend: trtllm, which reads the acceptance each TensorRT-LLM line really serves "
               "(its /perf_metrics never carries EAGLE-3 acceptance: TorchSampler leaves it empty, 1.4 removed the route)"
               if run.metrics_available.get(SPECULATIVE) is not False else
               "the server has no /perf_metrics route; use the reference server, or runtime.backend: trtllm")
        checks.add(name, None, None, spec.min_acceptance_length,
                   "not measurable: the server reported no speculative statistics for any request", fix)
    else:
        checks.add(name, tau >= spec.min_acceptance_length, tau, spec.min_acceptance_length,
                   f"tau {tau:g} over {overall['requests']} requests"
                   + (f" ({counted.label})" if counted is not None and counted.available else "")
                   + (" (estimated from total_draft_tokens / max_draft_len)" if overall["estimated"] else "")
                   + (f", per position {overall['per_position_acceptance']}" if overall["per_position_acceptance"] else ""))
    return overall, tau, measured


def _category_checks(checks: _Checks, run: Any, spec: Any, by_category: dict[str, list[dict[str, Any]]]
                     ) -> dict[str, Any]:
    """tau per prompt category from the per-request statistics (vLLM's counters around each request, the reference
    server's /perf_metrics); one check per floor of ``serve_test.min_acceptance_length_per_category``."""
    out = {}
    for category, stats in by_category.items():
        total = aggregate(stats)
        out[category] = {"requests": total["requests"], "acceptance_length": total["acceptance_length"],
                         "per_position_acceptance": total["per_position_acceptance"]}
    floors = getattr(spec, "min_acceptance_length_per_category", None) or {}
    off = getattr(run, "speculation_off", None)
    for category, floor in floors.items():
        name = f"acceptance length >= {floor:g} on category {category}"
        tau = (out.get(category) or {}).get("acceptance_length")
        if off:
            checks.add(name, None, None, floor, f"skipped: {off}")
        elif tau is None:
            checks.add(name, None, None, floor, f"not measurable: no per-request acceptance for the {category} prompts",
                       "per-request acceptance comes from vLLM's counters or the reference server's /perf_metrics")
        else:
            checks.add(name, tau >= floor, round(tau, 4), floor,
                       f"tau {tau:.4g} over {out[category]['requests']} {category} request(s)",
                       None if tau >= floor else f"more training data like the {category} prompts, or lower the floor")
    return out


def _oracle_check(checks: _Checks, verdict: dict[str, Any] | None) -> None:
    """The oracle's verdict as a check: passed, failed, or skipped with the reason (``passed`` None: a JUnit
    skipped testcase with that message). A skip of an oracle asked for (``required``) comes here as a failure."""
    if verdict is None:
        return
    fix = None
    if verdict.get("required"):
        fix = ((f"{verdict['enable']}, or " if verdict.get("enable") else "")
               + "serve_test.oracle.enabled: auto lets it skip where it cannot run (the skip is then reported)")
    elif verdict["passed"] is False and verdict.get("fix"):
        fix = verdict["fix"]
    elif verdict["passed"] is False:
        fix = "run `specconvert inspect` on engine/vllm/draft and convert/draft; see docs/serve.md (oracle)"
    checks.add("oracle: engine acceptance agrees with the reference decoder", verdict["passed"], verdict.get("delta"),
               (verdict.get("tolerance") or {}).get("acceptance_length"), verdict["message"], fix)


def _summary(rows: list[dict[str, Any]], tally: _Tally, n: int, overall: dict[str, Any], tau: float | None,
             measured: Any) -> dict[str, Any]:
    spec_lat = [r["latency_s"][SPECULATIVE] for r in rows if SPECULATIVE in r["latency_s"]]
    base_lat = [r["latency_s"][BASELINE] for r in rows if BASELINE in r["latency_s"]]
    return {
        "prompts": n,
        "exact_match": tally.matches,
        "exact_match_fraction": round(tally.matches / n if n else 0.0, 4),
        "numerical_ties": tally.ties,
        **{k: overall[k] for k in ("acceptance_length", "acceptance_rate", "per_position_acceptance")},
        "acceptance_estimated": overall["estimated"],
        **({"acceptance_length": None if tau is None else round(tau, 4),
            "acceptance_rate": (round(measured.accepted_tokens / measured.draft_tokens, 4)
                                if measured.draft_tokens and measured.accepted_tokens is not None else None),
            "per_position_acceptance": measured.per_position, "acceptance_estimated": measured.kind == "estimated",
            "acceptance": measured.as_dict()} if measured is not None else {}),
        "latency": {SPECULATIVE: _latency(spec_lat), BASELINE: _latency(base_lat)},
        "latency_ratio": (round(statistics.fmean(base_lat) / statistics.fmean(spec_lat), 3)
                          if spec_lat and base_lat and statistics.fmean(spec_lat) > 0 else None),
    }
