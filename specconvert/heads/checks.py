"""Validating a canonical head on its own and against its target; resolving aux layer ids.

Owns the list of everything that can be wrong with a head. Every check runs and
every problem is returned (never just the first), each with the fix, so that the
convert stage can print them all at once and exit 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Sequence

from ..errors import InputError
from .layouts import CanonicalHead, layer_indices, normalise_rope_scaling, rope_from_config

Severity = Literal["error", "warning"]


@dataclass
class Problem:
    """One thing wrong with a head. ``key`` names the fact checked (``hidden_size``, ``d2t.range`` …)."""

    key: str
    message: str
    fix: str
    severity: Severity = "error"

    def one_line(self) -> str:
        return f"{self.key}: {self.message}. Fix: {self.fix}"


@dataclass
class TargetInfo:
    """What the checks need to know about the target, from its config alone."""

    hidden_size: int
    vocab_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    max_position_embeddings: int
    rope_theta: float | None
    rope_scaling: dict | None
    num_key_value_heads: int

    @classmethod
    def from_config(cls, cfg: Any) -> "TargetInfo":
        """From a transformers ``PretrainedConfig`` or a config.json dict (4.x or 5 rope spelling).

        Multimodal configs are read through their ``text_config``.
        """
        data = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
        if isinstance(data.get("text_config"), dict) and "hidden_size" not in data:
            data = data["text_config"]
        missing = [k for k in ("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads") if not data.get(k)]
        if missing:
            raise InputError(f"target config lacks {', '.join(missing)}",
                             fix="point `target.model` at a causal-LM checkpoint with a complete config.json")
        heads = int(data["num_attention_heads"])
        theta, scaling = rope_from_config(data)
        return cls(
            hidden_size=int(data["hidden_size"]),
            vocab_size=int(data["vocab_size"]),
            num_hidden_layers=int(data["num_hidden_layers"]),
            num_attention_heads=heads,
            head_dim=int(data.get("head_dim") or data["hidden_size"] // heads),
            max_position_embeddings=int(data.get("max_position_embeddings") or 0),
            rope_theta=theta,
            rope_scaling=scaling,
            num_key_value_heads=int(data.get("num_key_value_heads") or heads),
        )


# ---------------------------------------------------------------- the head alone


def expected_shapes(head: CanonicalHead) -> dict[str, tuple[int, ...]]:
    """Canonical tensor -> shape the head's own config implies (fc's input width is checked against the target)."""
    a = head.arch
    h, q_rows, kv_rows = a.hidden_size, a.num_attention_heads * a.head_dim, a.num_key_value_heads * a.head_dim
    shapes: dict[str, tuple[int, ...]] = {"norm.weight": (h,)}
    for i in range(a.num_layers):
        p = f"layers.{i}."
        in_dim = 2 * h if i == 0 else h
        shapes.update({
            p + "self_attn.q_proj.weight": (q_rows, in_dim),
            p + "self_attn.k_proj.weight": (kv_rows, in_dim),
            p + "self_attn.v_proj.weight": (kv_rows, in_dim),
            p + "self_attn.o_proj.weight": (h, q_rows),
            p + "mlp.gate_proj.weight": (a.intermediate_size, h),
            p + "mlp.up_proj.weight": (a.intermediate_size, h),
            p + "mlp.down_proj.weight": (h, a.intermediate_size),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        })
        if a.attention_bias:
            shapes.update({p + "self_attn.q_proj.bias": (q_rows,), p + "self_attn.k_proj.bias": (kv_rows,),
                           p + "self_attn.v_proj.bias": (kv_rows,), p + "self_attn.o_proj.bias": (h,)})
        if a.mlp_bias:
            shapes.update({p + "mlp.gate_proj.bias": (a.intermediate_size,), p + "mlp.up_proj.bias": (a.intermediate_size,),
                           p + "mlp.down_proj.bias": (h,)})
    shapes["layers.0.hidden_norm.weight"] = (h,)
    return shapes


def check_head(head: CanonicalHead) -> list[Problem]:
    """Problems a head has on its own: layer count, shapes, missing/extra tensors, dtypes, unsupported variants."""
    a, t = head.arch, head.tensors
    problems: list[Problem] = []
    src = lambda name: head.source_names.get(name, name)  # noqa: E731

    found_layers = layer_indices(t)
    if found_layers and found_layers != list(range(a.num_layers)):
        problems.append(Problem(
            "num_layers", f"config says num_hidden_layers={a.num_layers} but the tensors hold layers {found_layers}",
            "fix num_hidden_layers in the head's config.json, or restore the missing layers' weights"))

    shapes = expected_shapes(head)
    q0 = t.get("layers.0.self_attn.q_proj.weight")
    for name, shape in shapes.items():
        if name not in t:
            layer_no = int(name.split(".")[1]) if name.startswith("layers.") else None
            if layer_no is not None and found_layers and layer_no not in found_layers:
                continue  # the whole layer is absent: reported once, by num_layers
            problems.append(Problem("missing_tensor", f"tensor {name} is missing",
                                    "restore the head's complete weights from its source"))
            continue
        got = tuple(t[name].shape)
        if got == shape:
            continue
        problems.append(_shape_problem(name, src(name), got, shape, a, q0))

    known = set(shapes) | {"fc.weight", "lm_head.weight", "d2t"}
    extra = sorted(set(t) - known)
    for name in extra:
        problems.append(Problem("unexpected_tensor", f"tensor {src(name)} has no place in the canonical layout",
                                "check `draft.format` and num_hidden_layers/attention_bias/mlp_bias in the head config"))
    for name in head.unexpected:
        problems.append(Problem("unexpected_tensor", f"tensor {name} is not part of an EAGLE-3 head",
                                "remove it, or check that this is an EAGLE-3 head (draft.format)"))

    if "lm_head.weight" in t and tuple(t["lm_head.weight"].shape) != (a.draft_vocab_size, a.hidden_size):
        problems.append(Problem("lm_head", f"lm_head.weight is {list(t['lm_head.weight'].shape)}, expected "
                                f"[draft_vocab_size={a.draft_vocab_size}, hidden_size={a.hidden_size}]",
                                "set draft_vocab_size in the head config to lm_head's row count"))
    if "d2t" in t and tuple(t["d2t"].shape) != (a.draft_vocab_size,):
        problems.append(Problem("d2t.shape", f"d2t has shape {list(t['d2t'].shape)}, expected [{a.draft_vocab_size}]",
                                "set draft_vocab_size to the draft vocabulary the head was trained with"))
    if "fc.weight" in t and t["fc.weight"].shape[0] != a.hidden_size:
        problems.append(Problem("fc", f"fc.weight has {t['fc.weight'].shape[0]} rows, hidden_size is {a.hidden_size}",
                                "fix hidden_size in the head config"))

    if a.dtype.startswith("mixed"):
        problems.append(Problem("dtype", f"floating tensors have several dtypes: {a.dtype}",
                                "cast the head to one dtype (e.g. bfloat16) before converting"))
    if "fc.bias" in head.dropped and bool(head.dropped["fc.bias"].any()):
        problems.append(Problem("fc.bias", "fc has a non-zero bias, which the canonical (Model Optimizer / TensorRT-LLM) "
                                "EAGLE-3 layout has no place for", "use a head trained without an fc bias"))
    if a.norm_before_residual:
        problems.append(Problem("norm_before_residual", "the head applies hidden_norm before the residual "
                                "(norm_before_residual: true); the canonical layout adds the residual unnormalised",
                                "use a head trained with norm_before_residual: false"))
    return problems


def _shape_problem(name, source, got, want, a, q0) -> Problem:
    got_l, want_l = list(got), list(want)
    if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")) and got[0] != want[0]:
        heads, what = (a.num_attention_heads, "num_attention_heads") if "q_proj" in name else \
            (a.num_key_value_heads, "num_key_value_heads")
        return Problem("attention.heads", f"{source} has {got[0]} rows, expected {what} × head_dim = "
                       f"{heads} × {a.head_dim} = {want[0]}",
                       "fix num_attention_heads / num_key_value_heads / head_dim in the head config")
    if name.startswith("layers.0.self_attn.") and name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
        return Problem("attention.input_dim", f"{source} takes {got[1]} inputs; layer 0 of an EAGLE-3 head takes "
                       f"2 × hidden_size = {want[1]} (embedding and hidden state concatenated)",
                       "fix hidden_size in the head config, or check that this is an EAGLE-3 (not EAGLE-1/2) head")
    return Problem("tensor_shape", f"{source} has shape {got_l}, expected {want_l} from the head config",
                   "fix the head config (hidden_size, intermediate_size, heads, head_dim) to match its weights")


# ---------------------------------------------------------------- against the target


def check_against_target(head: CanonicalHead, target: TargetInfo) -> list[Problem]:
    """Every problem of ``head`` on its own and with ``target`` (errors and warnings), not just the first."""
    problems = check_head(head)
    a, t = head.arch, head.tensors
    problems += _check_hidden(head, target)
    problems += _check_vocab(head, target)
    problems += _check_vocab_maps(head, target)

    if a.aux_layer_ids is not None:
        bad = [i for i in a.aux_layer_ids if not 0 <= i < target.num_hidden_layers]
        if bad:
            problems.append(Problem("aux_layer_ids", f"the head's aux layers {a.aux_layer_ids} (output convention, from "
                                    f"{a.aux_layer_ids_source}) include {bad}, outside the target's "
                                    f"0..{target.num_hidden_layers - 1}",
                                    "this head was trained for a deeper target; set `draft.aux_layers` explicitly "
                                    "or use a head trained for this target"))
        if len(a.aux_layer_ids) != a.n_aux and a.n_aux:
            problems.append(Problem("aux_layer_ids", f"the head names {len(a.aux_layer_ids)} aux layers but fc.weight "
                                    f"takes {a.n_aux} hidden states", "set `draft.aux_layers` to "
                                    f"{a.n_aux} layer ids"))

    if target.rope_theta is not None and abs(a.rope_theta - target.rope_theta) > 1e-6 * max(1.0, target.rope_theta):
        defaulted = any(n.startswith("rope_theta absent") for n in a.notes)
        problems.append(Problem(
            "rope_theta", f"head rope_theta {a.rope_theta:g}{' (absent, Llama default)' if defaulted else ''} differs "
            f"from the target's {target.rope_theta:g}; kept as the head's, heads may legitimately differ",
            "nothing if the head was trained this way; else set rope_theta in the head's config.json", "warning"))
    if normalise_rope_scaling(a.rope_scaling) != normalise_rope_scaling(target.rope_scaling):
        problems.append(Problem(
            "rope_scaling", f"head rope_scaling {a.rope_scaling} differs from the target's {target.rope_scaling}; "
            "kept as the head's", "nothing if the head was trained this way", "warning"))
    if target.max_position_embeddings and a.max_position_embeddings < target.max_position_embeddings:
        problems.append(Problem(
            "max_position_embeddings", f"head max_position_embeddings {a.max_position_embeddings} < the target's "
            f"{target.max_position_embeddings}; drafting beyond it runs on positions the head never saw",
            "limit build.max_seq_len, or accept lower acceptance on long contexts", "warning"))
    return problems


def _check_hidden(head: CanonicalHead, target: TargetInfo) -> list[Problem]:
    a, t, out = head.arch, head.tensors, []
    if a.target_hidden_size != target.hidden_size:
        out.append(Problem("hidden_size", f"the head was built for a target hidden size of {a.target_hidden_size}, "
                           f"the target has {target.hidden_size}", "use a head trained for this target"))
    elif "fc.weight" in t:
        fc_in = t["fc.weight"].shape[1]
        if fc_in % target.hidden_size or not a.n_aux:
            out.append(Problem("hidden_size", f"fc.weight takes {fc_in} inputs, not a multiple of the target hidden "
                               f"size {target.hidden_size}", "use a head trained for this target"))
    if a.hidden_size != target.hidden_size:
        out.append(Problem("hidden_size", f"the head's hidden size {a.hidden_size} differs from the target's "
                           f"{target.hidden_size}; the canonical head reads the target's embeddings, so they must match",
                           "use a head whose hidden_size equals the target's"))
    emb = head.dropped.get("embed_tokens.weight")
    if emb is not None and tuple(emb.shape) != (target.vocab_size, target.hidden_size):
        out.append(Problem("embed_tokens", f"embed_tokens.weight is {list(emb.shape)}, the target's embeddings are "
                           f"[{target.vocab_size}, {target.hidden_size}]: the head was trained with other embeddings",
                           "use a head trained for this target"))
    return out


def _check_vocab(head: CanonicalHead, target: TargetInfo) -> list[Problem]:
    a, t, out = head.arch, head.tensors, []
    if a.vocab_size != target.vocab_size:
        out.append(Problem("vocab_size", f"the head's vocab_size {a.vocab_size} differs from the target's "
                           f"{target.vocab_size}", "use a head trained for this target's tokenizer"))
    if a.draft_vocab_size > target.vocab_size:
        out.append(Problem("draft_vocab_size", f"draft_vocab_size {a.draft_vocab_size} exceeds the target vocabulary "
                           f"{target.vocab_size}", "use a head trained for this target's tokenizer"))
    if a.draft_vocab_size != target.vocab_size:
        if "lm_head.weight" not in t:
            out.append(Problem("lm_head", f"no lm_head.weight, and the draft vocabulary ({a.draft_vocab_size}) differs "
                               f"from the target's ({target.vocab_size}), so the target's lm_head cannot stand in",
                               "restore lm_head.weight from the head's source"))
        if "d2t" not in t:
            out.append(Problem("d2t", f"no d2t, and the draft vocabulary ({a.draft_vocab_size}) is smaller than the "
                               f"target's ({target.vocab_size}): draft ids cannot be mapped to target ids",
                               "restore d2t from the head's source"))
    return out


def _check_vocab_maps(head: CanonicalHead, target: TargetInfo) -> list[Problem]:
    from .._imports import require

    torch = require("torch", "check the draft head")
    a, out = head.arch, []
    d2t = head.tensors.get("d2t")
    mapped = None
    if d2t is not None and d2t.dim() == 1:
        if d2t.is_floating_point() or d2t.dtype == torch.bool:
            out.append(Problem("d2t.dtype", f"d2t has dtype {d2t.dtype}, not an integer type",
                               "restore d2t (int64 offsets) from the head's source"))
        else:
            mapped = torch.arange(d2t.numel(), dtype=torch.int64) + d2t.to(torch.int64)
            bad = ((mapped < 0) | (mapped >= target.vocab_size)).nonzero().flatten()
            if bad.numel():
                i = int(bad[0])
                out.append(Problem("d2t.range", f"{bad.numel()} d2t entries map outside the target vocabulary "
                                   f"[0, {target.vocab_size}) (first: draft id {i} -> {int(mapped[i])})",
                                   "use the d2t the head was trained with, for this target's tokenizer"))
            if torch.unique(mapped).numel() != mapped.numel():
                dup = mapped.numel() - torch.unique(mapped).numel()
                out.append(Problem("d2t.injective", f"d2t maps {dup} draft ids onto target ids already taken",
                                   "use the d2t the head was trained with"))
    t2d = head.dropped.get("t2d")
    if t2d is not None:
        flags = t2d.to(torch.bool).flatten()
        if flags.numel() != target.vocab_size:
            out.append(Problem("t2d", f"t2d covers {flags.numel()} target ids, the target vocabulary has "
                               f"{target.vocab_size}", "use a head trained for this target's tokenizer"))
        else:
            if int(flags.sum()) != a.draft_vocab_size:
                out.append(Problem("t2d", f"t2d marks {int(flags.sum())} target ids, draft_vocab_size is "
                                   f"{a.draft_vocab_size}", "restore t2d and d2t from the same source"))
            if mapped is not None and not out_of_range(mapped, target.vocab_size):
                missing = int((~flags[mapped]).sum())
                if missing:
                    out.append(Problem("t2d", f"t2d disagrees with d2t: {missing} draft ids map to target ids t2d does "
                                       "not mark", "restore t2d and d2t from the same source"))
    return out


def out_of_range(ids, vocab: int) -> bool:
    return bool(((ids < 0) | (ids >= vocab)).any())


def errors_of(problems: Sequence[Problem]) -> list[Problem]:
    return [p for p in problems if p.severity == "error"]


def raise_for_problems(problems: Sequence[Problem], what: str = "draft head") -> None:
    """Raise one :class:`InputError` listing every error-level problem (warnings are left to the caller to log)."""
    errors = errors_of(problems)
    if errors:
        raise InputError(f"{what} does not fit: {len(errors)} problem(s): " + "; ".join(p.message for p in errors),
                         fix=errors[0].fix, problems=[p.one_line() for p in errors])


# ---------------------------------------------------------------- aux layers


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """Model Optimizer's default, output convention: sorted({1, N//2-1, N-4})."""
    return sorted({1, max(0, num_layers // 2 - 1), max(0, num_layers - 4)})


_CONVENTION_SHIFT = {"output": 0, "sglang": 0, "input": -1, "vllm": -1, "speculators": -1}


def resolve_aux_layers(requested, convention: str, head_aux: list[int] | None, n_aux: int,
                       num_target_layers: int) -> tuple[list[int], str]:
    """Aux layer ids in the output convention and a note saying where they came from.

    ``requested``: ``"auto"`` (the head's own list, else Model Optimizer's default) or
    explicit ids numbered in ``convention``: ``output`` (id i = output of layer i; Model
    Optimizer, TensorRT-LLM), ``input`` (id i = input of layer i = output of i-1; EAGLE
    paper, vLLM, speculators), ``sglang`` (the ``eagle_aux_hidden_state_layer_ids`` an
    SGLang draft config holds: SGLang adds +1 itself before capturing at a layer's
    input, so these are already output-convention ids). ``head_aux`` must already be
    in the output convention (as :class:`HeadArch` holds it).
    """
    n = num_target_layers
    key = "draft.aux_layers"
    if requested == "auto":
        if head_aux is not None:
            ids, note = list(head_aux), "from the head's config"
        else:
            ids, note = default_aux_layer_ids(n), f"Model Optimizer default sorted({{1, N//2-1, N-4}}) for N={n}"
        origin = f"aux layers {ids} ({note})"
    else:
        if isinstance(requested, (str, bytes)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in requested):
            raise InputError(f"{key} must be 'auto' or a list of integers, got {requested!r}",
                             fix=f"set {key}: auto, or a list like [1, {n // 2 - 1}, {n - 4}]")
        if convention not in _CONVENTION_SHIFT:
            raise InputError(f"unknown aux layer convention '{convention}'",
                             fix="set draft.aux_layer_convention to output, input or sglang")
        shift = _CONVENTION_SHIFT[convention]
        ids = [i + shift for i in requested]
        note = f"{key} {list(requested)} in the {convention} convention"
        if shift:
            note += f" = {ids} in the output convention"
        origin = f"aux layers {list(requested)} ({convention} convention)"
    if len(set(ids)) != len(ids):
        raise InputError(f"{origin} name a layer twice", fix=f"give {key} {n_aux} distinct layer ids")
    bad = [i for i in ids if not 0 <= i < n]
    if bad:
        raise InputError(f"{origin} map to output-convention ids {ids}, of which {bad} lie outside the target's layers "
                         f"0..{n - 1}", fix=f"give {key} ids of layers that exist (check draft.aux_layer_convention)")
    if n_aux and len(ids) != n_aux:
        raise InputError(f"{origin}: {len(ids)} ids, but the head's fc takes {n_aux} hidden states",
                         fix=f"give {key} exactly {n_aux} ids")
    return ids, note
