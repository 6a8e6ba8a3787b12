"""report.json assembly, report.md (tables ready for a PR) and PNG plots (matplotlib, Agg).

matplotlib is imported only when plots are written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

REPORT_SCHEMA_VERSION = 1

DEFINITIONS = {
    "ttft_s": "request sent -> first SSE chunk carrying at least one output token",
    "e2e_s": "request sent -> end of the stream ([DONE])",
    "tpot_s": "(e2e_s - ttft_s) / (output_tokens - 1); requests with fewer than 2 tokens are left out",
    "itl_s": "one sample per token-carrying chunk after the first: gap since the previous token-carrying chunk / tokens in this chunk",
    "percentiles": "linear interpolation between closest ranks (NumPy's default)",
    "output_tokens_per_s": "output tokens of successful requests / run wall time (first send to last completion)",
    "output_tokens_per_s_per_user": "per request: output_tokens / e2e_s",
    "requests_per_s": "successful requests / run wall time",
    "acceptance_length": "tokens emitted per target (verify) step = 1 + accepted draft tokens per step; "
    "from the server's /perf_metrics when it has one, else estimated as mean tokens per decode chunk (estimate: true)",
    "per_position": "share of verify steps whose draft token at position i was accepted, among steps that drafted position i",
    "speedup": "per (baseline, speculative) run pair at one concurrency: speculative/baseline for throughput, "
    "baseline/speculative for latencies (> 1 = speculation is better); median, min-max and a bootstrap 95% interval of "
    "the median over the pairs",
    "fixed-kN": "an arm serving the same head with a fixed chain of N drafted tokens (bench.fixed_draft_lens), "
    "interleaved with the others; `speculative` is the bundle as built (tuned when it carries a tune result)",
    "free arms": "bench.baselines: speculation without a head on the same engine (`ngram`: prompt lookup; `suffix`: "
    "suffix decoding), interleaved with the others; each reports tau, the speedup over plain decoding and `lossless`. "
    "vLLM counts a draft only on steps that drafted something, so an n-gram arm's counter tau covers its matching "
    "steps; `tokens_per_step` (tokens per streamed chunk) counts every step",
    "lossless": "per level, each arm's greedy token ids against plain decoding's for the same request and repeat: "
    "`lossless` true when every compared request is identical, with the first divergences (request, position)",
    "categories": "per level, per prompt category (the prompt's `category` field): each arm's tau and per-position "
    "acceptance estimated from its stream chunks (engine counters are per run, not per request), and the speedup = the "
    "arm's output tokens per second of request time / plain decoding's, over the same requests",
    "input_lengths": "bench.context_lengths: per level, per requested input length (documents + a question, output "
    "fixed at max_tokens): tau and per-position acceptance from the stream chunks, the speedup over plain decoding in "
    "tokens per second of request time, and the prompt tokens the server counted",
    "versus_best": "per level, runs pooled: the bundle's output tok/s / the best of the baseline and every fixed arm "
    "(the tuning target: >= 0.97) and / the baseline's (>= 1.0)",
    "client_overhead": "time the client spent parsing SSE events and bookkeeping (not the network read itself), per event "
    "and as a share of e2e and of the mean ITL",
}


def _ms(value: Any) -> str:
    return "–" if value is None else f"{value * 1000:.1f}"


def _num(value: Any, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _ratio(summary: dict[str, Any] | None) -> str:
    if not summary or summary.get("median") is None:
        return "–"
    text = f"{summary['median']:.2f}× [{summary['min']:.2f}–{summary['max']:.2f}]"
    ci = summary.get("ci95")
    if ci and summary.get("pairs", 0) > 2:
        text += f" (95% CI {ci[0]:.2f}–{ci[1]:.2f})"
    return text


def _acceptance_text(acc: dict[str, Any] | None) -> str:
    if not acc or acc.get("acceptance_length") is None:
        return "–"
    return f"{acc['acceptance_length']:.2f}" + (" (est.)" if acc.get("estimate") else "")


def arm_labels(report: dict[str, Any]) -> list[str]:
    """Every arm of a report in run order (reports before arms existed: baseline and speculative)."""
    return [a["label"] for a in report.get("arms") or []] or ["baseline", "speculative"]


def _side(report: dict[str, Any], label: str) -> str:
    if label == "speculative" and any(a.get("tuned") for a in report.get("arms") or [] if a["label"] == label):
        return "speculative (tuned)"
    return label


def arm_entry(level: dict[str, Any], label: str) -> dict[str, Any]:
    """One arm's per-level block: acceptance, speedup over the baseline and lossless (the bundle's sits on the level)."""
    if label == "speculative":
        return {"acceptance": level.get("acceptance"), "speedup": level.get("speedup"), "lossless": level.get("lossless")}
    return (level.get("fixed") or {}).get(label) or (level.get("free") or {}).get(label) or {}


def _lossless_text(value: dict[str, Any] | None) -> str:
    if not value or value.get("lossless") is None:
        return "–" if not value else f"– ({value.get('why', 'not compared')})"
    if value["lossless"]:
        return f"yes ({value['identical']}/{value['compared']})"
    first = value["divergences"][0] if value.get("divergences") else {}
    return f"**NO** ({value['identical']}/{value['compared']}; request {first.get('request')} at token {first.get('position')})"


def side_by_side(report: dict[str, Any]) -> list[str]:
    """Head vs free speculation vs fixed chains vs plain decoding, per concurrency: tau, speedup, lossless."""
    labels = [label for label in arm_labels(report) if label != "baseline"]
    lines = ["### Arms side by side (speedup over plain decoding: median [min–max] over run pairs)", "",
             "| concurrency | arm | τ | tokens/step | output tok/s | speedup | lossless |", "|---:|---|---:|---:|---:|---|---|"]
    for level in report["levels"]:
        base = level.get("baseline") or {}
        lines.append(f"| {level['concurrency']} | plain | 1.00 | 1.00 | {_num(base.get('output_tokens_per_s'), 1)} | 1× | – |")
        for label in labels:
            arm, summary = arm_entry(level, label), level.get(label) or {}
            acc = arm.get("acceptance") or {}
            chunks = acc.get("chunk_estimate") if acc.get("chunk_estimate") is not None else (
                acc.get("acceptance_length") if acc.get("estimate") else None)
            lines.append(f"| {level['concurrency']} | {_side(report, label)} | {_acceptance_text(acc)} | {_num(chunks)} | "
                         f"{_num(summary.get('output_tokens_per_s'), 1)} | "
                         f"{_ratio((arm.get('speedup') or {}).get('output_tokens_per_s'))} | "
                         f"{_lossless_text(arm.get('lossless'))} |")
    return lines + [""]


def grouped_table(report: dict[str, Any], key: str, title: str, column: str) -> list[str]:
    """A per-group table (``key``: ``categories`` or ``input_lengths``) of every non-baseline arm, every level."""
    if not any(level.get(key) for level in report["levels"]):
        return []
    lines = [f"### {title}", "", f"| concurrency | {column} | requests | arm | τ (chunks) | accepted per position | speedup |",
             "|---:|---|---:|---|---:|---|---:|"]
    for level in report["levels"]:
        for group, entry in (level.get(key) or {}).items():
            for label, arm in entry["arms"].items():
                if label == "baseline":
                    continue
                positions = " ".join(_num(p) for p in arm.get("per_position") or []) or "–"
                speed = f"{arm['speedup']:.2f}×" if arm.get("speedup") else "–"
                lines.append(f"| {level['concurrency']} | {group} | {entry['requests']} | {_side(report, label)} | "
                             f"{_num(arm.get('acceptance_length'))} | {positions} | {speed} |")
    return lines + [""]


def context_section(report: dict[str, Any]) -> list[str]:
    """Acceptance per input length, with the head's training length and the warning when it is far exceeded."""
    context = report.get("context") or {}
    lines = grouped_table(report, "input_lengths", "Acceptance per input length (tokens; stream-chunk estimate; "
                          "output fixed at max_tokens)", "input length")
    if not lines and not context.get("warning"):
        return []
    if context.get("head_seq_len") is not None or context.get("warning"):
        lines.insert(2, f"The head was trained on sequences of {context.get('head_seq_len') or 'unknown'} tokens; "
                     f"the bundle serves up to {context.get('serving_context')}."
                     + (f" **Warning:** {context['warning']}." if context.get("warning") else "") + "\n")
    for level in report["levels"]:
        measured = {g: e.get("prompt_tokens_mean") for g, e in (level.get("input_lengths") or {}).items()}
        if any(measured.values()):
            lines.append(f"Prompt tokens as the server counted them (concurrency {level['concurrency']}): "
                         + ", ".join(f"{g} → {_num(v, 0)}" for g, v in measured.items()) + ".")
            lines.append("")
            break
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown tables (paste into a PR)."""
    lines: list[str] = []
    spec_ep = report["endpoints"]["speculative"]
    base_ep = report["endpoints"].get("baseline")
    work = report["workload"]
    lines.append(f"## specconvert bench — {report.get('name') or spec_ep['url']}")
    lines.append("")
    lines.append(f"- speculative: `{spec_ep['model']}` at {spec_ep['url']} ({spec_ep['api']})")
    if base_ep:
        lines.append(f"- baseline: `{base_ep['model']}` at {base_ep['url']}")
    for arm in report.get("arms") or []:
        if arm["label"].startswith("fixed-k"):
            ep = report["endpoints"].get(arm["label"]) or {}
            lines.append(f"- {arm['label']}: `{ep.get('model')}` at {ep.get('url')} ({arm['setting']})")
        elif arm.get("free"):
            ep = report["endpoints"].get(arm["label"]) or {}
            lines.append(f"- {arm['label']}: `{ep.get('model')}` at {ep.get('url')} ({arm['setting']})")
        elif arm["label"] == "speculative":
            lines.append(f"- the speculative arm serves {arm['setting']}")
    prompt_desc = (f"synthetic {work.get('input_tokens')} in / {work.get('output_tokens')} out"
                   if work.get("prompts") == "synthetic" else f"`{work.get('prompts')}`, max_tokens {work.get('max_tokens')}")
    settings = report["settings"]
    sequential = str(report.get("order", "")).startswith(("sequential", "in waves"))  # not interleaved
    lines.append(f"- load: {prompt_desc}; {settings['num_requests']} requests per run, {settings['repeats']} "
                 f"{'baseline/speculative' if sequential else 'interleaved'} pair(s) per level, "
                 f"temperature {settings['temperature']}")
    if sequential:
        lines.append(f"- order: {report['order']}: machine drift between the halves is not cancelled")
    if (report.get("placement") or {}).get("device") == "cuda":
        lines.append(f"- servers placed on GPUs: {report['placement']['mode']} ({report['placement']['why']})")
    lines.append(f"- {report['created_at']}, specconvert {report['specconvert_version']}")
    lines.append("")
    if base_ep:
        lines.append("### Speedup (speculative vs baseline; median [min–max] over run pairs)")
        lines.append("")
        lines.append("| concurrency | output tok/s | E2E latency | TPOT | acceptance length |")
        lines.append("|---:|---|---|---|---:|")
        for level in report["levels"]:
            sp = level.get("speedup") or {}
            lines.append(f"| {level['concurrency']} | {_ratio(sp.get('output_tokens_per_s'))} | {_ratio(sp.get('e2e_mean'))} "
                         f"| {_ratio(sp.get('tpot_mean'))} | {_acceptance_text(level.get('acceptance'))} |")
        lines.append("")
    if base_ep and any(level.get("free") or level.get("fixed") for level in report["levels"]):
        lines += side_by_side(report)
    if any(level.get("versus_best") for level in report["levels"]):
        fixed = [label for label in arm_labels(report) if label.startswith("fixed-k")]
        lines.append("### The bundle against fixed settings (output tok/s, runs of one level pooled)")
        lines.append("")
        lines.append("| concurrency | baseline | " + " | ".join(fixed) + f" | {_side(report, 'speculative')} | "
                     "vs best other | vs baseline |")
        lines.append("|---:|" + "---:|" * (len(fixed) + 4))
        for level in report["levels"]:
            vb = level.get("versus_best") or {}
            cells = [_num((level.get(label) or {}).get("output_tokens_per_s"), 1)
                     for label in ["baseline", *fixed, "speculative"]]
            best = f"{vb['ratio_to_best_other']:.3f}× ({vb['best_other']})" if vb.get("ratio_to_best_other") else "–"
            base = f"{vb['ratio_to_baseline']:.3f}×" if vb.get("ratio_to_baseline") else "–"
            lines.append(f"| {level['concurrency']} | " + " | ".join(cells) + f" | {best} | {base} |")
        lines.append("")
    lines += grouped_table(report, "categories", "Acceptance per category (stream-chunk estimate; speedup over plain "
                           "decoding in tokens per second of request time)", "category")
    lines += context_section(report)
    lines.append("### Latency and throughput (runs of one level pooled; ms)")
    lines.append("")
    lines.append("| side | conc. | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | ITL p50 | ITL p99 | E2E p50 | E2E p99 | tok/s | tok/s/user | req/s | failed |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for level in report["levels"]:
        for label in arm_labels(report):
            s = level.get(label)
            if not s:
                continue
            lines.append(
                f"| {_side(report, label)} | {level['concurrency']} | {_ms(s['ttft_s']['p50'])} | {_ms(s['ttft_s']['p99'])} | "
                f"{_ms(s['tpot_s']['p50'])} | {_ms(s['tpot_s']['p99'])} | {_ms(s['itl_s']['p50'])} | {_ms(s['itl_s']['p99'])} | "
                f"{_ms(s['e2e_s']['p50'])} | {_ms(s['e2e_s']['p99'])} | {_num(s['output_tokens_per_s'], 1)} | "
                f"{_num(s['output_tokens_per_s_per_user']['mean'], 1)} | {_num(s['requests_per_s'], 2)} | {s['failed']} |")
    lines.append("")
    acc = report.get("acceptance") or {}
    lines.append("### Acceptance")
    lines.append("")
    if acc.get("acceptance_length") is None:
        lines.append("Not available.")
    else:
        source = acc.get("measured_by") or (
            "estimate from tokens per streamed chunk" if acc.get("estimate") else "server /perf_metrics")
        lines.append(f"Acceptance length {acc['acceptance_length']:.3f} ({source}).")
        if acc.get("chunk_estimate") is not None:
            lines.append(f"The stream-chunk estimate on the same requests gave {acc['chunk_estimate']:.3f} "
                         f"(error {acc['chunk_estimate_error']:+.3f}).")
        per_position = acc.get("per_position")
        if per_position:
            lines.append("")
            lines.append("| draft position | " + " | ".join(str(i + 1) for i in range(len(per_position))) + " |")
            lines.append("|---|" + "---:|" * len(per_position))
            lines.append("| accepted | " + " | ".join(_num(p, 3) for p in per_position) + " |")
    lines.append("")
    overhead = report.get("client_overhead") or {}
    if overhead.get("per_event_s") is not None:
        lines.append(f"Client overhead: {overhead['per_event_s'] * 1e6:.1f} µs per SSE event, "
                     f"{_num((overhead.get('fraction_of_e2e') or 0) * 100, 3)}% of E2E, "
                     f"{_num((overhead.get('fraction_of_mean_itl') or 0) * 100, 3)}% of the mean ITL.")
        lines.append("")
    gate = report.get("gate")
    if gate:
        verdict = "passed" if gate["passed"] else "FAILED"
        lines.append(f"Gate `fail_below_speedup: {gate['fail_below_speedup']}`: {verdict} "
                     f"(lowest median throughput speedup {_num(gate.get('lowest_median'))}× at concurrency {gate.get('lowest_level')}).")
        lines.append("")
    if report.get("trtllm_bench"):
        tb = report["trtllm_bench"]
        lines.append(f"TensorRT-LLM `trtllm-bench latency` reports: {', '.join(f'`{Path(p).name}`' for p in tb.get('reports', {}).values())}.")
        lines.append("")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- plots


def write_plots(report: dict[str, Any], out_dir: Path) -> dict[str, str]:
    """Latency percentiles vs concurrency, speedup vs concurrency, per-position acceptance. Returns name -> path."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    written: dict[str, str] = {}
    levels = report["levels"]
    xs = [lv["concurrency"] for lv in levels]
    colors = {"baseline": "tab:gray", "speculative": "tab:green"}
    palette = iter(["tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:blue", "tab:red"])
    for label in arm_labels(report):
        colors.setdefault(label, next(palette, "black"))

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (key, title) in zip(axes, (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E latency"))):
        for label in arm_labels(report):
            if not any(lv.get(label) for lv in levels):
                continue
            for q, style in (("p50", "-o"), ("p99", "--x")):
                ys = [(lv[label][key][q] * 1000 if lv.get(label) and lv[label][key][q] is not None else float("nan")) for lv in levels]
                ax.plot(xs, ys, style, color=colors[label], label=f"{label} {q}")
        ax.set_title(title)
        ax.set_xlabel("concurrency")
        ax.set_ylabel("ms")
        _concurrency_axis(ax, xs)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    written["latency"] = _save(fig, out_dir / "latency_vs_concurrency.png", plt)

    fig, ax = plt.subplots(figsize=(6, 4))
    plotted = False
    for key, name, color in (("output_tokens_per_s", "output tok/s", "tab:green"), ("e2e_mean", "E2E latency", "tab:blue")):
        med, low, high = [], [], []
        for lv in levels:
            s = (lv.get("speedup") or {}).get(key) or {}
            m = s.get("median")
            med.append(m if m is not None else float("nan"))
            low.append((m - s["min"]) if m is not None else 0)
            high.append((s["max"] - m) if m is not None else 0)
        if any(v == v for v in med):
            ax.errorbar(xs, med, yerr=[low, high], fmt="-o", capsize=4, color=color, label=name)
            plotted = True
    ax.axhline(1.0, color="black", lw=0.8)
    gate = report.get("gate")
    if gate:
        ax.axhline(gate["fail_below_speedup"], color="tab:red", ls=":", label="gate")
    if not plotted:
        ax.text(0.5, 0.5, "no baseline run: no speedup", ha="center", va="center", transform=ax.transAxes)
    _concurrency_axis(ax, xs)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("speedup (×), median and min–max over pairs")
    ax.grid(alpha=0.3)
    if plotted or gate:
        ax.legend(fontsize=8)
    fig.tight_layout()
    written["speedup"] = _save(fig, out_dir / "speedup_vs_concurrency.png", plt)

    fig, ax = plt.subplots(figsize=(6, 4))
    acc = report.get("acceptance") or {}
    per_position = acc.get("per_position")
    if per_position:
        ax.bar([i + 1 for i in range(len(per_position))], [p or 0 for p in per_position], color="tab:green")
        ax.set_ylim(0, 1)
        ax.set_xlabel("draft position")
        ax.set_ylabel("accepted share")
        ax.set_title(f"acceptance length {acc['acceptance_length']:.2f}")
    else:
        al = acc.get("acceptance_length")
        note = "per-position acceptance not reported by the server"
        if al is not None:
            note += f"\nacceptance length {al:.2f}" + (" (estimate from tokens per chunk)" if acc.get("estimate") else "")
        ax.text(0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    fig.tight_layout()
    written["acceptance"] = _save(fig, out_dir / "acceptance_per_position.png", plt)
    for key, name, xlabel in (("categories", "acceptance_per_category.png", "category"),
                              ("input_lengths", "acceptance_per_input_length.png", "input tokens (requested)")):
        if any(lv.get(key) for lv in levels):
            written[key] = _grouped_plot(report, key, out_dir / name, xlabel, colors, plt)
    return written


def _grouped_plot(report: dict[str, Any], key: str, path: Path, xlabel: str, colors: dict[str, str], plt: Any) -> str:
    """tau (left) and speedup (right) per group, one bar per non-baseline arm, at the first level that has groups."""
    level = next(lv for lv in report["levels"] if lv.get(key))
    groups = list(level[key])
    labels = [label for label in arm_labels(report) if label != "baseline"
              and any(label in level[key][g]["arms"] for g in groups)]
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(groups) + 4), 4))
    width = 0.8 / max(len(labels), 1)
    for i, label in enumerate(labels):
        xs = [j + (i - (len(labels) - 1) / 2) * width for j in range(len(groups))]
        arms = [level[key][g]["arms"].get(label) or {} for g in groups]
        for ax, field in zip(axes, ("acceptance_length", "speedup")):
            ax.bar(xs, [a.get(field) or 0 for a in arms], width, color=colors.get(label, "black"), label=label)
    for ax, ylabel in zip(axes, ("τ (tokens per step, stream chunks)", "speedup over plain decoding (×)")):
        ax.set_xticks(range(len(groups)), groups, rotation=30, ha="right")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"concurrency {level['concurrency']}")
    fig.tight_layout()
    return _save(fig, path, plt)


def _concurrency_axis(ax: Any, levels: list[int]) -> None:
    """Log-2 spaced concurrency levels, labelled with their plain values (1, 4, 16, not 2^k)."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(x) for x in levels])
    ax.minorticks_off()


def _save(fig: Any, path: Path, plt: Any) -> str:
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


# --------------------------------------------------------------------------- console


def print_summary(report: dict[str, Any]) -> None:
    """The summary table on stdout (human mode)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="specconvert bench", title_justify="left")
    for col in ("conc.", "side", "TTFT p50 ms", "TPOT p50 ms", "E2E p99 ms", "tok/s", "speedup", "τ"):
        table.add_column(col, justify="right")
    short = {"speculative": "spec", "baseline": "base"}
    if any(a.get("tuned") for a in report.get("arms") or []):
        short["speculative"] = "tuned"
    for level in report["levels"]:
        for label in arm_labels(report):
            s = level.get(label)
            if not s:
                continue
            if label == "speculative":
                ratio = (level.get("speedup") or {}).get("output_tokens_per_s") or {}
                acc = _acceptance_text(level.get("acceptance"))
            else:
                arm = arm_entry(level, label)
                ratio = (arm.get("speedup") or {}).get("output_tokens_per_s") or {}
                acc = _acceptance_text(arm.get("acceptance"))
            speed = f"{ratio['median']:.2f}×" if label != "baseline" and ratio.get("median") is not None else ""
            table.add_row(str(level["concurrency"]), short.get(label, label), _ms(s["ttft_s"]["p50"]), _ms(s["tpot_s"]["p50"]),
                          _ms(s["e2e_s"]["p99"]), _num(s["output_tokens_per_s"], 1), speed, acc if label != "baseline" else "")
    console = Console(highlight=False, soft_wrap=True)
    console.print(table)
    for level in report["levels"]:
        vb = level.get("versus_best")
        if vb:
            console.print(f"concurrency {level['concurrency']}: {short['speculative']} {vb['speculative_output_tokens_per_s']:.1f} "
                          f"tok/s = {vb['ratio_to_best_other']:.3f}× the best other arm ({vb['best_other']}), "
                          + (f"{vb['ratio_to_baseline']:.3f}× the baseline" if vb.get("ratio_to_baseline") else "no baseline"))

