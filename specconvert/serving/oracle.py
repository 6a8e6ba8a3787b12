"""The reference decoder as an oracle for an engine's acceptance, and the lossless diagnosis.

Greedy EAGLE-3 acceptance is a deterministic function of (target, head, aux layers, d2t,
norms, rope, prompt tokens): an engine that serves the same head on the same prompts
should accept what our reference decoder accepts, up to numerics. A gap points at an
integration bug no engine reports by itself (DESIGN §2). The comparison and the hints are
pure functions here; :func:`reference_acceptance` runs the decoder (heavy imports inside).

Lossless: at the first token where speculative and baseline output differ, the baseline's
top logprobs say whether that position was a near-tie (a numerical flip between batch
shapes, which bf16 engines really do) or a real divergence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence

from ..acceptance import Acceptance, from_counts

REFERENCE_SOURCE = "reference decoder (greedy, in-process)"

# Why each likely cause is named, in the order they are most often the culprit.
CAUSES = {
    "aux_layers": "aux-layer numbering: the engine captures other target layers than the head was trained on "
                  "(vLLM reads the top-level eagle_aux_hidden_state_layer_ids as the *input* of layer k = output id + 1; "
                  "compare engine/vllm/draft/config.json with convert's decisions.aux_layer_ids)",
    "d2t": "d2t: the draft-to-target vocabulary map is missing, identity or offset (draft token i must map to "
           "i + d2t[i]; check draft_vocab_size and the d2t tensor the engine loads)",
    "norm": "norm layout: a draft norm (final norm, hidden_norm, input_layernorm) was dropped or renamed, so the "
            "engine runs it with its default weights",
    "rope": "rope: the engine computes the draft's rotary embedding with other rope_theta/rope_scaling than the head "
            "was trained with (config.json rope settings)",
    "template": "chat template: the engine and the reference tokenise the prompts differently (a served chat template "
                "or special tokens that differ from the tokenizer's)",
}


@dataclass(frozen=True)
class OracleTolerance:
    """Agreement bounds: |tau_engine - tau_ref| and each |rate_engine[i] - rate_ref[i]|."""

    acceptance_length: float
    per_position: float


def compare(engine: Acceptance, reference: Acceptance, tol: OracleTolerance,
            found: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """The oracle's verdict: agreement within ``tol``, the gaps, and (on disagreement) the likely causes in order.
    ``found``: concrete departures of the engine's files from the head (``backends.vllm.overlay.findings``),
    named first when the verdict is a disagreement."""
    out: dict[str, Any] = {"engine": engine.as_dict(), "reference": reference.as_dict(),
                           "tolerance": {"acceptance_length": tol.acceptance_length, "per_position": tol.per_position}}
    if not engine.available or not reference.available:
        missing = "engine" if not engine.available else "reference"
        out.update(passed=False, status="unavailable", delta=None, per_position_delta=None,
                   message=f"no {missing} acceptance to compare ({(engine if missing == 'engine' else reference).label})",
                   causes=[])
        return out
    delta = engine.acceptance_length - reference.acceptance_length
    engine_pos, note, mismatch = aligned_positions(engine.per_position, reference.per_position)
    if mismatch:
        out.update(passed=False, status="mismatch", delta=round(delta, 4), per_position_delta=None, causes=[],
                   message=mismatch)
        return out
    pos_delta = None
    if engine_pos is not None and reference.per_position is not None:
        pos_delta = [None if (e is None or r is None) else round(e - r, 4)
                     for e, r in zip(engine_pos, reference.per_position, strict=True)]
    worst_pos = max((abs(d) for d in pos_delta or [] if d is not None), default=0.0)
    agrees = abs(delta) <= tol.acceptance_length and worst_pos <= tol.per_position
    found = list(found or [])
    # A departure of the engine's files from the head is a bug even when acceptance hides it: an aux
    # list one layer early moved a memorising head's tau by only 0.16-0.26 (tests/vllm), around the
    # tolerance, and a head trained on more data would show it more.
    passed = agrees and not found
    causes = [] if passed else likely_causes(engine, reference)
    if found:
        causes = list(dict.fromkeys([f["cause"] for f in found if f["cause"] in CAUSES] + causes))
    caught_by = ([] if agrees else ["acceptance"]) + (["engine files"] if found else [])
    message = (f"engine tau {engine.acceptance_length:.3f} vs reference {reference.acceptance_length:.3f} "
               f"(delta {delta:+.3f}, tolerance ±{tol.acceptance_length:g}")
    if pos_delta is not None:
        message += f"; per position delta {pos_delta}, tolerance ±{tol.per_position:g}"
    message += ")"
    if found:
        message += (". Acceptance agrees within tolerance, but" if agrees else ".") + \
            " found in the engine's files: " + "; ".join(f["detail"] for f in found)
    if not passed:
        message += ". Likely causes, most likely first: " + "; ".join(CAUSES[c] for c in causes)
    if note:
        message += f" ({note})"
    out.update(found=found, passed=passed, status="agrees" if passed else "disagrees", delta=round(delta, 4),
               per_position_delta=pos_delta, message=message, causes=causes, caught_by=caught_by)
    return out


def aligned_positions(engine: Sequence[float | None] | None, reference: Sequence[float | None] | None
                      ) -> tuple[list[float | None] | None, str | None, str | None]:
    """The engine's per-position rates over the reference's positions: ``(rates, note, mismatch)``.

    vLLM keeps one counter per position up to ``num_speculative_tokens`` (vllm 0.32
    ``v1/spec_decode/metrics.py``, ``SpecDecodingProm``); under a per-batch schedule it drafts fewer
    at batch 1, and the positions past that count nothing. Those are dropped, with a note. Any other
    difference in length means the two did not decode the same setting: ``mismatch`` says so, and
    nothing is compared (never cut by ``zip``).
    """
    if engine is None or reference is None:
        return (list(engine) if engine is not None else None), None, None
    engine, note = list(engine), None
    if len(engine) > len(reference) and all(not x for x in engine[len(reference):]):
        note = (f"the engine's positions {len(reference)}-{len(engine) - 1} drafted nothing at this batch size; "
                f"compared over the {len(reference)} it drafted")
        engine = engine[:len(reference)]
    if len(engine) != len(reference):
        return None, None, (f"the engine reports acceptance at {len(engine)} draft positions and the reference decoded "
                            f"{len(reference)}: they did not decode the same setting, so nothing is compared "
                            "(a bug in how serve-test reads the engine's draft length; please report it)")
    return engine, note, None


def likely_causes(engine: Acceptance, reference: Acceptance) -> list[str]:
    """Order the usual suspects by the shape of the disagreement.

    - The engine accepts (almost) nothing at position 0 while the reference does: the draft's
      output is garbage to the engine, which a wrong d2t or a dropped norm does first.
    - The engine accepts less, but not nothing: it drafts from the wrong features (aux layers)
      or with the wrong positions (rope).
    - The engine accepts *more*: the two did not decode the same prompts (chat template).
    """
    e0 = (engine.per_position or [None])[0]
    r0 = (reference.per_position or [None])[0]
    if engine.acceptance_length > reference.acceptance_length:
        return ["template", "aux_layers", "rope"]
    if e0 is not None and r0 is not None and e0 < 0.25 * r0:
        return ["d2t", "norm", "aux_layers", "rope", "template"]
    return ["aux_layers", "rope", "norm", "d2t", "template"]


# ---------------------------------------------------------------------- lossless diagnosis

_TOKEN_ID = re.compile(r"^token_id:(\d+)$")  # vLLM's return_tokens_as_token_ids spelling; the reference server's too


def token_id_of(token: str) -> int | None:
    """The id in a ``token_id:N`` spelling, else None (a token spelled as text)."""
    match = _TOKEN_ID.match(token)
    return int(match[1]) if match else None


def _is(token: str, wanted: int | str) -> bool:
    if isinstance(wanted, int):
        return token_id_of(token) == wanted
    return token == wanted


def top_logprobs_at(logprobs: Any, index: int) -> list[tuple[str, float]] | None:
    """``[(token, logprob), ...]`` best first at output position ``index`` of an OpenAI ``logprobs`` object.

    Chat completions: ``{"content": [{"token", "logprob", "top_logprobs": [{"token", "logprob"}]}]}``;
    completions: ``{"tokens": [...], "top_logprobs": [{token: logprob}, ...]}``.
    """
    if not isinstance(logprobs, dict):
        return None
    content = logprobs.get("content")
    if isinstance(content, list):
        if index >= len(content) or not isinstance(content[index], dict):
            return None
        entry = content[index]
        tops = entry.get("top_logprobs") or [{"token": entry.get("token"), "logprob": entry.get("logprob")}]
        pairs = [(str(t.get("token")), float(t["logprob"])) for t in tops
                 if isinstance(t, dict) and isinstance(t.get("logprob"), (int, float))]
    else:
        tops = logprobs.get("top_logprobs")
        if not isinstance(tops, list) or index >= len(tops) or not isinstance(tops[index], dict):
            return None
        pairs = [(str(k), float(v)) for k, v in tops[index].items() if isinstance(v, (int, float))]
    return sorted(pairs, key=lambda kv: -kv[1]) or None


def divergence_margin(tops: Sequence[tuple[str, float]], speculative_token: int | str | None = None) -> dict[str, Any]:
    """How far the baseline's choice was ahead where the outputs split (nats, >= 0).

    The speculative token is found among the top logprobs by id (an int against the ``token_id:N``
    spelling both vLLM and the reference server use on request) or by text (a str). Found: the
    margin is exact. Not listed: the margin is at least the gap to the last listed token (a lower
    bound). Only one token listed: nothing is known about the speculative token (margin None).
    """
    best_token, best = tops[0]
    if speculative_token is not None:
        if _is(best_token, speculative_token):  # the probe's own best is the speculative token: the baseline flipped
            return {"margin": 0.0, "baseline_token": best_token, "speculative_token": best_token, "exact": True,
                    "note": "the baseline's best token here, asked again, is the speculative one"}
        for token, lp in tops[1:]:
            if _is(token, speculative_token):
                return {"margin": round(best - lp, 6), "baseline_token": best_token, "speculative_token": token,
                        "exact": True}
    elif len(tops) > 1:
        return {"margin": round(best - tops[1][1], 6), "baseline_token": best_token, "speculative_token": tops[1][0],
                "exact": False, "note": "speculative token not identified: gap to the runner-up"}
    if len(tops) == 1:
        return {"margin": None, "baseline_token": best_token, "speculative_token": None, "exact": False,
                "note": "the baseline listed only its best token, so the speculative token's logprob is unknown"}
    return {"margin": round(best - tops[-1][1], 6), "baseline_token": best_token, "speculative_token": None,
            "exact": False, "lower_bound": True,
            "note": "the speculative token is not among the baseline's top logprobs: the margin is a lower bound"}


def classify_divergence(margin: dict[str, Any] | None, tie_margin: float) -> str:
    """``tie`` (the baseline's lead is below ``tie_margin`` nats), ``divergence`` (at or above it), or ``unknown``
    (no logprobs, a single listed token, or a lower bound below ``tie_margin``: nothing decides it)."""
    if not margin or margin.get("margin") is None:
        return "unknown"
    if margin.get("lower_bound"):
        return "divergence" if margin["margin"] >= tie_margin else "unknown"
    return "tie" if margin["margin"] < tie_margin else "divergence"


def diagnose(logprobs: Any, index: int, speculative_token: int | str | None, tie_margin: float) -> dict[str, Any]:
    """The report's diagnosis of one divergence, from the baseline's OpenAI ``logprobs`` object."""
    tops = top_logprobs_at(logprobs, index)
    if not tops:
        return {"token_index": index, "class": "unknown", "margin": None,
                "note": "the baseline returned no top logprobs (OpenAI `logprobs`/`top_logprobs`)"}
    margin = divergence_margin(tops, speculative_token)
    return {"token_index": index, "class": classify_divergence(margin, tie_margin), "tie_margin": tie_margin,
            "top_logprobs": [[t, round(lp, 6)] for t, lp in tops], **margin}


async def diagnose_by_asking(send: Callable[[int, dict[str, Any]], Awaitable[Any]], chat: bool,
                             baseline_ids: Sequence[int], speculative_ids: Sequence[int], index: int,
                             tie_margin: float, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Diagnose the first difference (output token ``index``) by asking the baseline server again for the same
    prompt with ``index + 1`` tokens and its top logprobs: ``send(max_tokens, request_fields)`` sends that request
    (non-streaming) and returns a :class:`~specconvert.serving.client.Completion`. serve-test and tune share it."""
    from .client import RequestFailed

    if index >= len(baseline_ids):
        return {"token_index": index, "class": "divergence", "margin": None,
                "note": "one output is a prefix of the other (different length)"}
    logprob_fields = {"logprobs": True, "top_logprobs": 5} if chat else {"logprobs": 5}
    # Logprob tokens by id (vLLM's request field, spelled ``token_id:N``: v0.8.3's
    # vllm/entrypoints/openai/serving_engine.py `_get_decoded_token`, later releases'
    # `format_token_id_placeholder`; the reference server honours it too), so the speculative
    # token is found among the baseline's by id, not by a text that several ids can share.
    by_id = {**(extra or {}), **logprob_fields, "return_tokens_as_token_ids": True}
    try:
        try:
            probe = await send(index + 1, by_id)
        except RequestFailed as exc:
            if exc.kind != "http":
                raise
            # trtllm-serve refuses unknown request fields (its OpenAIBaseModel forbids extras,
            # tensorrt_llm/serve/openai_protocol.py): ask again, tokens spelled as text.
            text_fields = {k: v for k, v in (extra or {}).items() if k != "return_tokens_as_token_ids"}
            probe = await send(index + 1, {**text_fields, **logprob_fields})
    except RequestFailed as exc:
        return {"token_index": index, "class": "unknown", "margin": None, "note": f"logprobs request failed: {exc.message}"}
    return diagnose(getattr(probe, "logprobs", None), index,
                    speculative_ids[index] if index < len(speculative_ids) else None, tie_margin)


# ---------------------------------------------------------------------- what the oracle decodes, and its cost


@dataclass(frozen=True)
class Decoding:
    """The draft setting the served engine runs, which the oracle decodes too: a chain of ``draft_len``
    tokens, or the dynamic ``tree`` (reference server only: vLLM has chains only)."""

    draft_len: int
    tree: dict[str, int] | None = None
    source: str = ""

    @property
    def depth(self) -> int:
        return int(self.tree["depth"]) if self.tree else self.draft_len

    def as_dict(self) -> dict[str, Any]:
        return {"draft_len": self.draft_len, "tree": self.tree, "source": self.source}


# Throughput assumed for the time estimate (a decode step reads every weight once):
# CPU 6 GB/s is what SmolLM2-135M fp32 gave on the 2-core development machine (87 ms per
# cached forward, DESIGN section 5); a GPU streams ~1 TB/s but an eager transformers forward
# costs ~20 ms of launches whatever the size. Both are assumptions, printed as such.
BYTES_PER_S = {"cpu": 6e9, "cuda": 1e12}
FLOOR_S = {"cpu": 0.0, "cuda": 0.02}
OVERHEAD_GIB = {"cpu": 1.5, "cuda": 1.0}  # torch + transformers in the process; CUDA context and activations
PROMPT_ALLOWANCE = 1024  # prompt tokens assumed per request for the KV cache (not tokenized yet)


@dataclass(frozen=True)
class Footprint:
    """The oracle's estimated memory and time, from configs alone (before anything is loaded)."""

    device: str
    dtype: str
    target_parameters: int
    weights_gib: float
    kv_cache_gib: float
    need_gib: float
    tokens: int
    forwards: int
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {"device": self.device, "dtype": self.dtype, "target_parameters": self.target_parameters,
                "weights_gib": round(self.weights_gib, 2), "kv_cache_gib": round(self.kv_cache_gib, 3),
                "need_gib": round(self.need_gib, 2), "tokens": self.tokens, "target_forwards_at_most": self.forwards,
                "estimated_s": round(self.seconds, 1),
                "assumptions": f"{BYTES_PER_S[self.device] / 1e9:g} GB/s of weights read per forward, "
                               f"{FLOOR_S[self.device] * 1000:g} ms at least, tau 1 (every token a target forward), "
                               f"{OVERHEAD_GIB[self.device]:g} GiB process overhead, {PROMPT_ALLOWANCE} prompt tokens"}


def estimate(target_config: dict[str, Any], draft_weight_bytes: int, dtype_size: int, dtype: str, device: str,
             prompts: int, max_tokens: int, depth: int) -> Footprint | None:
    """Memory and time of decoding ``prompts`` x ``max_tokens`` greedily on ``device`` (``cpu``/``cuda``) in
    ``dtype`` (``dtype_size`` bytes); None when the config lacks the sizes to count parameters."""
    from ..models.size import GIB, parameter_count

    params = parameter_count(target_config)
    if params is None:
        return None
    c = target_config.get("text_config") if isinstance(target_config.get("text_config"), dict) else target_config
    heads = int(c.get("num_attention_heads") or 1)
    head_dim = int(c.get("head_dim") or int(c.get("hidden_size", 0)) // heads)
    kv_per_token = 2 * int(c.get("num_hidden_layers", 0)) * int(c.get("num_key_value_heads") or heads) * head_dim
    weights = params * dtype_size + draft_weight_bytes
    kv = kv_per_token * (PROMPT_ALLOWANCE + max_tokens + depth + 1) * dtype_size
    need = (weights + kv) / GIB + OVERHEAD_GIB[device]
    forwards = prompts * (max_tokens + 1)
    per_forward = max(weights / BYTES_PER_S[device], FLOOR_S[device])
    return Footprint(device, dtype, params, weights / GIB, kv / GIB, need, prompts * max_tokens, forwards,
                     forwards * per_forward)


def skipped(reason: str, **extra: Any) -> dict[str, Any]:
    """An oracle verdict that neither passes nor fails the run: it did not run, and ``reason`` says why."""
    return {"passed": None, "status": "skipped", "message": f"skipped: {reason}", "reason": reason, "causes": [],
            "delta": None, **extra}


# ---------------------------------------------------------------------- running the reference


def check(engine_dir: Path, prompts: Sequence[Any], max_tokens: int, spec: Any, engine: Acceptance,
          decoding: Decoding, device: str, dtype: str, found: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """Run the reference decoder (``spec``: the recipe's ``serve_test.oracle``) as the engine decodes
    (``decoding``) on ``device`` in ``dtype``, and compare ``engine`` with it."""
    import time

    started = time.monotonic()
    reference, rows = reference_acceptance(engine_dir, prompts, max_tokens, decoding, device, dtype)
    verdict = compare(engine, reference, OracleTolerance(spec.tolerance, spec.per_position_tolerance), found)
    verdict.update(prompts=rows, duration_s=round(time.monotonic() - started, 2))
    return verdict


def reference_acceptance(engine_dir: Path, prompts: Sequence[Any], max_tokens: int, decoding: Decoding,
                         device: str = "cpu", dtype: str = "auto") -> tuple[Acceptance, list[dict[str, Any]]]:
    """Greedy reference decoding of ``prompts`` (``stages.serve_test.Prompt``) with the bundle's head and the
    target's chat template, in the engine's draft setting; the overall acceptance and one row per prompt."""
    from .. import output
    from ..reference import DecodeSettings
    from .engine import load_engine

    engine = load_engine(engine_dir, "oracle", device=device, dtype=dtype)
    try:
        settings = DecodeSettings(max_draft_len=decoding.draft_len, tree=decoding.tree, temperature=0.0,
                                  stop_token_ids=tuple(engine.decoder.eos_token_ids))
        rows, drafts, accepted = [], 0, 0
        depth = decoding.depth
        per_pos = [0] * depth
        with output.progress() as bar:
            task = bar.add_task("oracle: reference decoding", total=len(prompts))
            for prompt in prompts:
                ids = (engine.encode(engine.render_chat(prompt.messages), chat=True) if prompt.messages is not None
                       else engine.encode(prompt.prompt))
                result = engine.decoder.generate(ids, max_tokens, settings)
                steps = [r for r in result.step_records if r.kind == "spec"]
                drafts += len(steps)
                accepted += sum(r.accepted for r in steps)
                for r in steps:
                    for i in range(min(r.accepted, depth)):
                        per_pos[i] += 1
                rows.append({"id": prompt.id, "token_ids": result.token_ids, "steps": len(steps),
                             "acceptance_length": round(result.acceptance_length, 4),
                             "per_position_acceptance": [round(x, 4) for x in result.per_position_acceptance]})
                bar.advance(task)
    finally:
        engine.close()
    return from_counts(REFERENCE_SOURCE, drafts=drafts, draft_tokens=drafts * depth, accepted_tokens=accepted,
                       accepted_per_position=per_pos, requests=len(rows)), rows
