"""The `tune` stage: measure acceptance and step costs, predict, check, and choose the draft shape.

convert/ + recipe `tune` -> <workdir>/tune/ (report.json, report.md, tune.png, manifest.json).
`build` then writes each engine's own schedule from ``manifest.json``'s ``schedules``.

What is measured, on the recipe's runtime:
- the head's per-position acceptance on the tune prompts (chain of the longest length K);
- the wall time of one decoding step with k drafted tokens, k = 0..K, at each level of
  `tune.concurrency` — every candidate length really runs, interleaved prompt by prompt
  (k order rotating) so machine drift hits every candidate alike.
From those, `tuning.model` predicts tokens/s per (k, concurrency); the measured tokens/s
of the same runs decides, and the predicted vs measured table goes into the report.

The reference runtime serves one request at a time: a step advances one request at any
concurrency, so its measured cost at concurrency 1 stands for every level (said in the
report). Engines that batch (vLLM) are measured per level by their own runner.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import output
from ..errors import InputError
from ..manifest import compute_fingerprint, manifest_hash, stage_dir, up_to_date, write_json_atomic
from ..tuning import model as M

STAGE = "tune"
REPORT_SCHEMA_VERSION = 1


@dataclass
class TuneResult:
    manifest: dict[str, Any]
    skipped: bool


@dataclass
class Measured:
    """One candidate draft length at one concurrency: what really ran."""

    draft_len: int
    concurrency: int
    tokens: int = 0
    steps: int = 0
    decode_s: float = 0.0  # wall time of decoding steps (prefill excluded)
    accepted_per_position: list[int] = field(default_factory=list)
    identical_to_plain: bool = True

    @property
    def step_s(self) -> float:
        return self.decode_s / self.steps if self.steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def acceptance_length(self) -> float | None:
        return self.tokens / self.steps if self.steps else None

    def as_dict(self) -> dict[str, Any]:
        return {"draft_len": self.draft_len, "concurrency": self.concurrency, "tokens": self.tokens, "steps": self.steps,
                "decode_s": round(self.decode_s, 4), "step_s": round(self.step_s, 6),
                "tokens_per_second": round(self.tokens_per_second, 3),
                "acceptance_length": round(self.acceptance_length, 4) if self.acceptance_length else None,
                "identical_to_plain": self.identical_to_plain}


def tune_dir(recipe: Any) -> Path:
    return recipe.workdir_path / "tune"


def read_tune(recipe: Any) -> dict[str, Any] | None:
    """The tune manifest when a complete one exists (build picks its schedules up), else None."""
    from ..manifest import read_manifest

    return read_manifest(tune_dir(recipe))


def candidate_lengths(recipe: Any) -> list[int]:
    top = recipe.tune.max_draft_len or recipe.build.max_draft_len
    return list(range(0, top + 1))


def levels(recipe: Any) -> list[int]:
    found = sorted(set(recipe.tune.concurrency or recipe.bench.concurrency) | {1})
    return found


# --- the reference runtime -------------------------------------------------------------------


def measure_reference(decoder: Any, prompts: Sequence[Sequence[int]], lengths: Sequence[int], max_new_tokens: int,
                      on_run: Callable[[], None] | None = None) -> dict[int, Measured]:
    """Decode every prompt with every chain length (rotating order per prompt); k = 0 is plain decoding."""
    from ..reference.decoder import DecodeSettings

    stop = decoder.eos_token_ids
    out = {k: Measured(k, 1, accepted_per_position=[0] * k) for k in lengths}
    for n, ids in enumerate(prompts):
        order = list(lengths[n % len(lengths):]) + list(lengths[: n % len(lengths)])
        plain_tokens: list[int] | None = None
        results = {}
        for k in order:
            settings = DecodeSettings(speculative=k > 0, max_draft_len=max(k, 1), stop_token_ids=stop)
            results[k] = decoder.generate(list(ids), max_new_tokens, settings)
            if on_run:
                on_run()
        plain_tokens = results[0].token_ids if 0 in results else None
        for k, res in results.items():
            m = out[k]
            decode = [s for s in res.step_records if s.kind != "prefill"]
            m.steps += len(decode)
            m.tokens += sum(len(s.token_ids) for s in decode)
            m.decode_s += res.wall_time_s - res.prefill_time_s  # every phase of every step, the loop included
            for s in decode:
                for i in range(min(s.accepted, k)):
                    m.accepted_per_position[i] += 1
            if plain_tokens is not None and res.token_ids != plain_tokens:
                m.identical_to_plain = False
    return out


def _reference_runs(recipe: Any, convert: dict[str, Any], lengths: list[int]) -> dict[int, Measured]:
    from ..prompts import load_samples
    from ..reference.decoder import ReferenceDecoder
    from ..training.data import prompt_ids

    tune = recipe.tune
    samples = load_samples(tune.prompts or recipe.bench.prompts, "tune.prompts", recipe.base_dir)[: tune.num_prompts]
    decoder = ReferenceDecoder.from_convert_manifest(convert, device=recipe.runtime.device)
    encoded = [prompt_ids(s, decoder.tokenizer) for s in samples]
    total = len(encoded) * len(lengths)
    output.log(f"tune: {len(encoded)} prompts x draft lengths {lengths} on the reference decoder, {tune.max_tokens} tokens each")
    with output.progress() as bar:
        task = bar.add_task("tune: decoding", total=total)
        return measure_reference(decoder, encoded, lengths, tune.max_tokens, on_run=lambda: bar.advance(task))


# --- the decision ------------------------------------------------------------------------------


def decide(runs: dict[tuple[int, int], Measured], per_position: list[float], margin: float,
           requests_per_step: dict[int, float] | None) -> dict[str, Any]:
    """Predicted vs measured table, per-level choice (by measured tokens/s) and the segments."""
    step_s = {key: m.step_s for key, m in runs.items() if m.steps}
    predicted = {(p.draft_len, p.concurrency): p for p in M.predict(per_position, step_s, requests_per_step)}
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
                     "step_s": round(m.step_s, 6), "identical_to_plain": m.identical_to_plain})
    choice = M.best_per_level(measured_rates, margin)
    predicted_choice = M.best_per_level({key: p.tokens_per_second for key, p in predicted.items()}, margin)
    segments = M.schedule(choice)
    return {"rows": rows, "choice": choice, "predicted_choice": predicted_choice, "segments": segments,
            "measured_rates": measured_rates}


def engine_schedules(recipe: Any, segments: list[M.Segment], choice: dict[int, int]) -> dict[str, Any]:
    """Each engine's own form of the decision (written into the bundle by build)."""
    from ..backends.sglang import schedule as sglang
    from ..backends.trtllm import schedule as trt, versions
    from ..backends.vllm import schedule as vllm

    target = versions.resolve(recipe.runtime.trtllm_version)
    return {
        "trtllm": {"version": target.version,
                   **trt.speculative_settings(segments, recipe.build.max_batch_size, target.version,
                                              allow_zero=recipe.tune.trtllm_allow_zero)},
        "vllm": vllm.speculative_settings(segments, recipe.build.max_batch_size),
        "sglang": sglang.speculative_settings(choice),
        # The reference server decodes one request at a time: its batch is always 1.
        "reference": {"speculate": segments[0].draft_len > 0, "max_draft_len": segments[0].draft_len},
    }


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


def run(recipe: Any, force: bool = False) -> TuneResult:
    """Tune (or keep, when unchanged) ``<workdir>/tune/``; return its manifest."""
    from .build import read_convert

    convert = read_convert(recipe)
    backend = recipe.runtime.backend
    if backend != "reference":
        raise InputError(f"runtime.backend: tune measures on the reference runtime in this version, not {backend!r}",
                         fix="run `specconvert tune RECIPE --set runtime.backend=reference`; the chosen schedule is "
                             "written for every engine")
    lengths = candidate_lengths(recipe)
    lvls = levels(recipe)
    final = tune_dir(recipe)
    inputs = {"recipe": recipe.section("tune", "build", "runtime"), "bench_prompts": recipe.bench.prompts,
              "convert_manifest": manifest_hash(convert)}
    if not force:
        existing = up_to_date(final, compute_fingerprint(STAGE, inputs))
        if existing is not None:
            output.log(f"tune: {final} is up to date (use --force to measure again)")
            return TuneResult(existing, skipped=True)

    t0 = time.perf_counter()
    measured = _reference_runs(recipe, convert, lengths)
    top = max(lengths)
    per_position = [a / measured[top].steps for a in measured[top].accepted_per_position] if measured[top].steps else [0.0] * top
    # One request per step at any concurrency: the level-1 measurement stands for every level.
    runs = {(k, b): m for k, m in measured.items() for b in lvls}
    serial = {b: 1 for b in lvls}
    decision = decide(runs, per_position, recipe.tune.margin, serial)
    schedules = engine_schedules(recipe, decision["segments"], decision["choice"])
    lines = verdict_lines(decision["choice"], lengths, decision["measured_rates"])
    for line in lines:
        output.log(f"tune: {line}")
    if any(not m.identical_to_plain for m in measured.values()):
        raise InputError("tune: a speculative run's output differs from plain decoding (greedy must be lossless)",
                         fix="run `specconvert serve-test RECIPE` to find the first divergence")
    report = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "runtime": backend,
        "runtime_note": "the reference server serves one request at a time: each level's cost is concurrency 1's",
        "candidates": lengths,
        "concurrency": lvls,
        "margin": recipe.tune.margin,
        "per_position_acceptance": [round(p, 4) for p in per_position],
        "measurements": [m.as_dict() for m in measured.values()],
        "table": decision["rows"],
        "choice": {str(b): k for b, k in decision["choice"].items()},
        "predicted_choice": {str(b): k for b, k in decision["predicted_choice"].items()},
        "segments": [s.as_dict() for s in decision["segments"]],
        "schedules": schedules,
        "verdict": lines,
        "tune_s": round(time.perf_counter() - t0, 2),
    }
    with stage_dir(final, STAGE, inputs) as stage:
        write_json_atomic(stage.path / "report.json", report)
        (stage.path / "report.md").write_text(render_markdown(report), encoding="utf-8")
        if recipe.tune.plots:
            _plot(report, stage.path / "tune.png")
        manifest = stage.finish(schedules=schedules, segments=report["segments"], choice=report["choice"],
                                per_position_acceptance=report["per_position_acceptance"], verdict=lines,
                                timings={"tune_s": report["tune_s"]})
    return TuneResult(manifest, skipped=False)


def render_markdown(report: dict[str, Any]) -> str:
    out = [f"# specconvert tune ({report['runtime']})", "",
           f"Per-position acceptance (chain {max(report['candidates'])}): {report['per_position_acceptance']}", "",
           f"Note: {report['runtime_note']}", "",
           "| concurrency | draft length | predicted tok/s | measured tok/s | predicted tokens/step | measured tokens/step | step ms |",
           "|---|---|---|---|---|---|---|"]
    for r in report["table"]:
        out.append(f"| {r['concurrency']} | {r['draft_len']} | {r['predicted_tokens_per_second']} | "
                   f"{r['measured_tokens_per_second']} | {r['predicted_tokens_per_step']} | "
                   f"{r['measured_tokens_per_step']} | {r['step_s'] * 1000:.1f} |")
    out += ["", "## Choice", ""] + [f"- {line}" for line in report["verdict"]]
    out += ["", "## Schedules written into the bundle", ""]
    for engine, s in report["schedules"].items():
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
    ax.set_xlabel("draft length (0 = no speculation)")
    ax.set_ylabel("tokens/s")
    ax.set_title("specconvert tune")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
