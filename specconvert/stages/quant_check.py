"""What quantizing the target costs in acceptance: measured, reported, gated (part of convert).

The head is evaluated twice on the same held-out prompts with the same decoder and
settings: once on the unquantized target and once on Model Optimizer's fake-quantized
target from the very calibration that produced ``convert/target``. Losslessness of the
quantized run is checked against the quantized target's own greedy output (the
deployment's reference), not the unquantized one's. The drop in tau and per-position
acceptance goes to the manifest, a plot and, when ``quantize.max_acceptance_drop`` is
set, a gate (:class:`CheckFailed`, exit 1).

The gate judges an interval, not two point estimates: a paired bootstrap over the prompts
(the same prompts ran on both targets, so each resample keeps a prompt's two runs together)
gives a 95% interval of each drop, and a limit fails only when the whole interval lies
beyond it, so prompt-to-prompt noise alone does not flip the verdict. A drop whose point
estimate is beyond the limit while its interval still reaches below it passes, said as
inconclusive (more `quantize.eval_samples` narrow it). The gate also fails when the
quantized run's speculative output differs from the quantized target's own greedy output
(greedy must be lossless) and when no draft shape was compared at all.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .. import output
from ..errors import CheckFailed
from ..recipe import Recipe

PLOT_NAME = "quantization_acceptance.png"
CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 0


def eval_shapes(recipe: Recipe) -> dict[str, dict[str, Any]]:
    """The draft shapes every held-out evaluation of convert measures: the build's chain and a dynamic tree."""
    tree = recipe.build.tree.model_dump() if recipe.build.tree else {"top_k": 8, "depth": 5, "total_tokens": 32}
    return {f"chain-{recipe.build.max_draft_len}": {"max_draft_len": recipe.build.max_draft_len},
            f"tree-{tree['top_k']}x{tree['depth']}-{tree['total_tokens']}": {"tree": tree}}


def same_settings(recipe: Recipe) -> bool:
    """Whether the training evaluation used exactly the quantization check's prompts and lengths (then it is reused)."""
    train, q = recipe.draft.train, recipe.quantize
    return (train is not None and train.eval_prompts == q.eval_prompts and train.eval_samples == q.eval_samples
            and train.eval_max_new_tokens == q.eval_max_new_tokens)


def _evaluate(recipe: Recipe, label: str, source_dir: Path, draft_dir: Path, aux_layer_ids: list[int], model: Any,
              device: str, dtype: str) -> dict[str, Any]:
    from ..training.data import load_prompt_samples
    from ..training.evaluate import measure as measure_head

    q = recipe.quantize
    shapes = eval_shapes(recipe)
    items = load_prompt_samples(q.eval_prompts, "quantize.eval_prompts", recipe.base_dir)[: q.eval_samples]
    with output.progress() as bar:
        task = bar.add_task(f"measure acceptance on the {label} target (reference decoder)", total=len(items) * (1 + len(shapes)))
        return measure_head(source_dir, draft_dir, aux_layer_ids, q.eval_prompts, items, q.eval_max_new_tokens, shapes,
                            device=device, dtype=dtype, on_prompt=lambda: bar.advance(task), model=model)


def measure_unquantized(recipe: Recipe, source_dir: Path, draft_dir: Path, aux_layer_ids: list[int], device: str,
                        dtype: str, timings: dict[str, float]) -> dict[str, Any]:
    """The unquantized pass, run (and its target freed) before the quantized target is loaded: one target in memory at a time."""
    t0 = time.perf_counter()
    report = _evaluate(recipe, "unquantized", source_dir, draft_dir, aux_layer_ids, None, device, dtype)
    timings["quant_check_unquantized_s"] = round(time.perf_counter() - t0, 3)
    return report


def measure(recipe: Recipe, source_dir: Path, draft_dir: Path, aux_layer_ids: list[int], quantized_model: Any,
            device: str, dtype: str, unquantized: dict[str, Any], reused: bool, timings: dict[str, float]) -> dict[str, Any]:
    """The quantized pass, its difference from ``unquantized``, the gate verdict."""
    q = recipe.quantize
    t0 = time.perf_counter()
    quantized = _evaluate(recipe, f"{q.format} fake-quantized", source_dir, draft_dir, aux_layer_ids, quantized_model,
                          device, dtype)
    timings["quant_check_quantized_s"] = round(time.perf_counter() - t0, 3)
    items = quantized["samples"]
    report = {
        "prompts": q.eval_prompts, "samples": items, "max_new_tokens": q.eval_max_new_tokens,
        "quantized_target": f"Model Optimizer fake-quant ({q.format}), same calibration as convert/target",
        "unquantized_reused_from_training_evaluation": reused,
        "unquantized": unquantized, "quantized": quantized,
        "drop": compare(unquantized, quantized),
    }
    report["gate"] = gate(report["drop"], q.max_acceptance_drop, quantized["shapes"])
    for name, d in report["drop"].items():
        output.check(quantized["shapes"][name]["identical_to_plain"],
                     f"quantized target, {name}: tau {d['tau_unquantized']:.2f} -> {d['tau_quantized']:.2f} "
                     f"(drop {d['tau_drop']:+.2f}, {d['relative_drop']:+.1%}"
                     + (f"; 95% interval {d['interval']['tau_drop'][0]:+.2f} to {d['interval']['tau_drop'][1]:+.2f}"
                        if d.get("interval") else "") + f"), per position {d['per_position_unquantized']} -> "
                     f"{d['per_position_quantized']}; output identical to the quantized target's greedy: "
                     f"{quantized['shapes'][name]['identical_to_plain']}")
    return report


def compare(unquantized: dict[str, Any], quantized: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per shape: both taus, the drop (positive = the quantized target accepts less), per-position both and their difference."""
    out = {}
    for name, u in unquantized["shapes"].items():
        qz = quantized["shapes"].get(name)
        if qz is None:
            continue
        tu, tq = u["acceptance_length"], qz["acceptance_length"]
        pu, pq = u["per_position_acceptance"], qz["per_position_acceptance"]
        n = max(len(pu), len(pq))
        pu_, pq_ = pu + [0.0] * (n - len(pu)), pq + [0.0] * (n - len(pq))
        out[name] = {
            "tau_unquantized": tu, "tau_quantized": tq, "tau_drop": round(tu - tq, 4),
            "relative_drop": round((tu - tq) / tu, 4) if tu else 0.0,
            "per_position_unquantized": pu, "per_position_quantized": pq,
            "per_position_drop": [round(a - b, 4) for a, b in zip(pu_, pq_)],
            "interval": interval(u.get("per_prompt"), qz.get("per_prompt")),
        }
    return out


def _tau(steps: Any, accepted: Any, axis: int = -1) -> Any:
    """tau over prompts pooled as the evaluation pools them: 1 + accepted / verification steps (1 without steps)."""
    import numpy as np

    total = np.sum(steps, axis=axis)
    return 1.0 + np.divide(np.sum(accepted, axis=axis), total, out=np.zeros_like(total, dtype=float), where=total > 0)


def interval(unquantized: Any, quantized: Any, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
             seed: int = SEED) -> dict[str, Any] | None:
    """A paired bootstrap over prompts (``scipy.stats.bootstrap``, percentile, seeded) of the tau drop and the
    relative drop, from per-prompt ``[steps, accepted]`` on both targets (the same prompts, in the same order).
    None when the per-prompt figures are missing or do not pair up; fewer than two prompts give no spread."""
    import numpy as np

    if not unquantized or not quantized or len(unquantized) != len(quantized):
        return None
    u, q = np.asarray(unquantized, dtype=float), np.asarray(quantized, dtype=float)
    out: dict[str, Any] = {"confidence": confidence, "prompts": len(u), "resamples": resamples, "seed": seed,
                           "method": "paired bootstrap over prompts (scipy.stats.bootstrap, percentile)"}

    def drops(su: Any, au: Any, sq: Any, aq: Any, axis: int = -1) -> Any:
        tu, tq = _tau(su, au, axis), _tau(sq, aq, axis)
        return np.stack([tu - tq, np.divide(tu - tq, tu, out=np.zeros_like(tu), where=tu != 0)])

    point = drops(u[:, 0], u[:, 1], q[:, 0], q[:, 1])
    if len(u) < 2 or np.all(u == u[0]) and np.all(q == q[0]):  # no spread to resample: the interval is the point
        low, high = point, point
        if len(u) < 2:
            out["note"] = "one prompt: no spread to estimate"
    else:
        from scipy import stats

        result = stats.bootstrap((u[:, 0], u[:, 1], q[:, 0], q[:, 1]), drops, paired=True, vectorized=True,
                                 confidence_level=confidence, n_resamples=resamples, method="percentile",
                                 rng=np.random.default_rng(seed))
        low, high = result.confidence_interval.low, result.confidence_interval.high
    out["tau_drop"] = [round(float(low[0]), 4), round(float(high[0]), 4)]
    out["relative_drop"] = [round(float(low[1]), 4), round(float(high[1]), 4)]
    return out


def _beyond(d: dict[str, Any], key: str, limit: float) -> tuple[bool, bool]:
    """(fails, inconclusive) of one drop figure against ``limit``: it fails when its whole interval lies beyond the
    limit (the point estimate where there is no interval); inconclusive when only part of it does."""
    span = (d.get("interval") or {}).get(key)
    if span is None:
        return d[key] > limit, False
    return span[0] > limit, d[key] > limit >= span[0] or span[1] > limit >= span[0]


def gate(drop: dict[str, dict[str, Any]], limit: Any,
         quantized_shapes: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The verdict of ``quantize.max_acceptance_drop`` over every shape: which figures broke which key (judged on
    each drop's bootstrap interval), a quantized run that was not lossless, or nothing compared at all."""
    if limit is None:
        return {"set": False, "passed": None, "failures": []}
    failures, inconclusive = [], []
    if not drop:
        failures.append("no draft shape was compared (the two evaluations share no shape), so the drop is unknown")
    for name, shape in (quantized_shapes or {}).items():
        if shape.get("identical_to_plain") is False:
            failures.append(f"{name}: on the quantized target the speculative output differs from the target's own "
                            "greedy output (greedy must be lossless)")
    for name, d in drop.items():
        span = d.get("interval") or {}
        for key, bound, shown in (("tau_drop", limit.tau, lambda x: f"{x:.3f}"),
                                  ("relative_drop", limit.relative, lambda x: f"{x:.1%}")):
            if bound is None:
                continue
            fails, unsure = _beyond(d, key, bound)
            where = (f" (95% interval {shown(span[key][0])} to {shown(span[key][1])} over {span['prompts']} prompts)"
                     if span.get(key) else "")
            what = "a drop" if key == "tau_drop" else "a relative drop"
            setting = f"quantize.max_acceptance_drop.{'tau' if key == 'tau_drop' else 'relative'}"
            limit_text = f"{setting} {shown(bound) if key == 'relative_drop' else bound}"
            if fails:
                failures.append(f"{name}: tau {d['tau_unquantized']:.3f} -> {d['tau_quantized']:.3f}, {what} of "
                                f"{shown(d[key])} > {limit_text}{where}")
            elif unsure:
                inconclusive.append(f"{name}: {what} of {shown(d[key])}{where} reaches both sides of {limit_text}: "
                                    "passed as inconclusive; more quantize.eval_samples narrow the interval")
    return {"set": True, "passed": not failures, "failures": failures, "inconclusive": inconclusive,
            "tau": limit.tau, "relative": limit.relative}


def enforce(report: dict[str, Any], fmt: str) -> None:
    """Raise the gate's failure (exit 1), naming the figures and the key."""
    verdict = report["gate"]
    for line in verdict.get("inconclusive") or []:
        output.warn(f"quantize.max_acceptance_drop: {line}")
    output.check(verdict["passed"] is not False, "quantize.max_acceptance_drop: "
                 + ("not set (measured only)" if not verdict["set"] else "passed" if verdict["passed"] else "FAILED"))
    if verdict["passed"] is False:
        more = f" (and {len(verdict['failures']) - 1} more)" if len(verdict["failures"]) > 1 else ""
        raise CheckFailed(
            f"quantizing the target to {fmt} costs more acceptance than allowed: {verdict['failures'][0]}{more}",
            fix="raise quantize.max_acceptance_drop, pick another quantize.format, or fine-tune the head on the "
                "quantized target's features",
            problems=verdict["failures"],
        )


def plot(report: dict[str, Any], path: Path, fmt: str) -> Path | None:
    """Per-position acceptance on both targets, one panel per shape (matplotlib, Agg)."""
    try:
        import matplotlib
    except ImportError:
        output.warn("matplotlib is not installed: no quantization plot (pip install matplotlib)")
        return None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    drop = report["drop"]
    fig, axes = plt.subplots(1, max(1, len(drop)), figsize=(5 * max(1, len(drop)), 3.6), squeeze=False)
    for ax, (name, d) in zip(axes[0], drop.items()):
        n = max(len(d["per_position_unquantized"]), len(d["per_position_quantized"]))
        xs = list(range(1, n + 1))
        width = 0.4
        ax.bar([x - width / 2 for x in xs][: len(d["per_position_unquantized"])], d["per_position_unquantized"], width,
               label=f"unquantized (tau {d['tau_unquantized']:.2f})")
        ax.bar([x + width / 2 for x in xs][: len(d["per_position_quantized"])], d["per_position_quantized"], width,
               label=f"{fmt} (tau {d['tau_quantized']:.2f})")
        ax.set_title(f"{name}: tau drop {d['tau_drop']:+.2f} ({d['relative_drop']:+.0%})")
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance rate")
        ax.set_ylim(0, 1.05)
        ax.set_xticks(xs)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run(recipe: Recipe, source_dir: Path, draft_dir: Path, out_dir: Path, aux_layer_ids: list[int], quantized_model: Any,
        device: str, dtype: str, unquantized: dict[str, Any], reused: bool, timings: dict[str, float]) -> dict[str, Any]:
    """Measure the quantized target, plot into ``out_dir``, then enforce the gate (after the figures are logged)."""
    report = measure(recipe, source_dir, draft_dir, aux_layer_ids, quantized_model, device, dtype, unquantized, reused, timings)
    png = plot(report, Path(out_dir) / PLOT_NAME, recipe.quantize.format)
    report["plot"] = str(png) if png else None
    report["eval_s"] = {k: v for k, v in timings.items() if k.startswith("quant_check_")}
    enforce(report, recipe.quantize.format)
    return report
