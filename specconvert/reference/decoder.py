"""The reference EAGLE-3 decoder: draft, verify, accept, keep the caches in step.

One request at a time (batch size 1), on CPU or CUDA, in the dtype asked for. The
same target wrapper also runs the plain (non-speculative) baseline, so the two are
compared on equal terms.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from ..errors import InputError
from .acceptance import sample_token, verify_greedy, verify_sampling
from .draft_head import DraftHead
from .target import TargetModel
from .tree import DraftTree, EagleDrafter, OracleDrafter, TreeShape

DRAFTERS = ("eagle", "oracle", "none")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class DecodeSettings:
    """How to decode. ``tree=None`` drafts a chain of ``max_draft_len`` tokens."""

    max_draft_len: int = 3
    tree: dict[str, int] | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: Sequence[int] = ()
    speculative: bool = True
    # None: no log-probs. N >= 0: each Step carries, per emitted token, the target's log-softmax of that
    # token and of its N most likely alternatives (raw logits: before temperature/top-k/top-p, as
    # OpenAI and vLLM report them). On the speculative path they come from the verify forward's rows.
    logprobs: int | None = None

    def shape(self) -> TreeShape:
        if self.tree:
            shape = TreeShape(top_k=int(self.tree["top_k"]), depth=int(self.tree["depth"]), total_tokens=int(self.tree["total_tokens"]))
        else:
            shape = TreeShape.chain(int(self.max_draft_len))
        if shape.top_k < 1 or shape.depth < 1 or shape.total_tokens < 2:
            raise InputError(f"bad draft shape {shape}", fix="use top_k >= 1, depth >= 1, total_tokens >= 2")
        return shape

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


@dataclass
class Step:
    """One target forward and what it produced."""

    kind: str  # "prefill" | "spec" | "plain"
    token_ids: list[int]  # new tokens this step (after stop / max-token truncation)
    accepted: int  # draft tokens accepted by verification
    drafted_depth: int  # depth of the tree that was verified (0 for prefill / plain)
    tree_size: int  # draft tokens verified
    draft_time_s: float
    verify_time_s: float
    finished: str | None = None  # "stop" | "length" when this step ends the request
    phases: dict[str, float] | None = None  # spec steps: draft, target_forward, accept, cache_update, commit (s)
    logprobs: list["TokenLogprob"] | None = None  # one per token_ids entry when DecodeSettings.logprobs is set


@dataclass
class TokenLogprob:
    """The target's log-probability of an emitted token and of its most likely alternatives."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, log-prob), most likely first


def token_logprobs(rows: torch.Tensor, tokens: Sequence[int], top_n: int | None) -> list[TokenLogprob] | None:
    """``rows[i]`` are the target logits that predicted ``tokens[i]`` (extra rows are ignored)."""
    if top_n is None or not tokens:
        return None if top_n is None else []
    logp = torch.log_softmax(rows[: len(tokens)].detach().float().cpu(), dim=-1)
    chosen = logp.gather(1, torch.as_tensor(list(tokens), dtype=torch.long).unsqueeze(1)).squeeze(1).tolist()
    if top_n > 0:
        values, ids = torch.topk(logp, min(top_n, logp.shape[-1]), dim=-1)
        tops = [list(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
    else:
        tops = [[] for _ in tokens]
    return [TokenLogprob(int(t), float(c), top) for t, c, top in zip(tokens, chosen, tops)]


@dataclass
class GenerateResult:
    prompt_token_ids: list[int]
    token_ids: list[int]
    steps: int  # target forwards after the prefill
    accepted_per_step: list[int]
    acceptance_length: float  # tau: mean tokens emitted per target forward (after prefill)
    per_position_acceptance: list[float]  # fraction of steps whose draft token at depth i+1 was accepted
    tokens_per_second: float
    draft_time_s: float
    verify_time_s: float
    prefill_time_s: float
    wall_time_s: float
    finish_reason: str | None
    step_records: list[Step] = field(default_factory=list, repr=False)

    def summary(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "acceptance_length": round(self.acceptance_length, 4),
            "accepted_per_step": self.accepted_per_step,
            "per_position_acceptance": [round(x, 4) for x in self.per_position_acceptance],
            "tokens_per_second": round(self.tokens_per_second, 3),
            "draft_time_s": round(self.draft_time_s, 4),
            "verify_time_s": round(self.verify_time_s, 4),
            "prefill_time_s": round(self.prefill_time_s, 4),
            "wall_time_s": round(self.wall_time_s, 4),
            "finish_reason": self.finish_reason,
        }


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        from ..errors import EnvironmentMissing

        raise EnvironmentMissing("runtime.device is cuda but no CUDA device is visible", fix="set runtime.device: cpu (or auto)")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype, target_dir: str | Path) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        cfg_path = Path(target_dir) / "config.json"
        cfg = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.is_file() else {}
        dtype = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
    if dtype not in _DTYPES:
        raise InputError(f"unsupported dtype '{dtype}'", fix=f"use one of {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def eos_ids(target_dir: Path, tokenizer) -> tuple[int, ...]:
    """Generation config eos ids first (SmolLM2 stops on <|im_end|>), then the tokenizer's."""
    ids: list[int] = []
    gen = Path(target_dir) / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text(encoding="utf-8")).get("eos_token_id")
        ids.extend([eos] if isinstance(eos, int) else list(eos or []))
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    return tuple(dict.fromkeys(int(i) for i in ids))


def load_tokenizer(target_dir: Path):
    """The target folder's tokenizer (transformers), or None where the folder has none."""
    names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    if not any((Path(target_dir) / n).is_file() for n in names):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(target_dir))


class ReferenceDecoder:
    """EAGLE-3 speculative decoding (or the plain baseline) over a transformers target."""

    def __init__(self, target: TargetModel, head: DraftHead | None = None, tokenizer=None, drafter: str = "eagle",
                 eos_token_ids: Sequence[int] = ()):
        if drafter not in DRAFTERS:
            raise InputError(f"unknown drafter '{drafter}'", fix=f"use one of {', '.join(DRAFTERS)}")
        if drafter == "eagle" and head is None:
            drafter = "none"
        self.target = target
        self.head = head
        self.tokenizer = tokenizer
        self.drafter_kind = drafter
        self.eos_token_ids = tuple(eos_token_ids)
        self._eagle = EagleDrafter(head, target.embed) if drafter == "eagle" else None
        self._oracle = OracleDrafter(target.vocab_size) if drafter == "oracle" else None
        self.oracle_prep_time_s = 0.0

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_dirs(cls, target_dir, draft_dir=None, aux_layer_ids=None, device: str = "cpu", dtype: str = "float32",
                  drafter: str = "eagle", norm_layout: str = "eagle3", model: Any = None) -> "ReferenceDecoder":
        """``draft_dir=None`` (and drafter ``eagle``) gives a baseline-only decoder. ``model``: an in-memory
        target (e.g. Model Optimizer's fake-quantized one) used instead of the weights in ``target_dir``."""
        target_dir = Path(target_dir)
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, target_dir)
        head = None
        if drafter == "eagle" and draft_dir is not None:
            if not aux_layer_ids:
                cfg = json.loads((Path(draft_dir) / "config.json").read_text(encoding="utf-8")) if (Path(draft_dir) / "config.json").is_file() else {}
                aux_layer_ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
            if not aux_layer_ids:
                raise InputError("no aux layer ids for the draft head", fix="pass aux_layer_ids (decisions.aux_layer_ids of the convert manifest)")
        use_head = drafter == "eagle" and draft_dir is not None
        if model is not None:
            target = TargetModel(model, aux_layer_ids if use_head else None)
        else:
            target = TargetModel.from_dir(target_dir, aux_layer_ids if use_head else None, dt, dev)
        if use_head:
            head = DraftHead.from_dir(draft_dir, num_aux=len(aux_layer_ids), target_lm_head=target.lm_head_weight(),
                                      norm_layout=norm_layout, dtype=dt, device=dev)
            if head.cfg.num_aux != len(aux_layer_ids):
                raise InputError(
                    f"draft head's fc takes {head.cfg.num_aux} target layers but {len(aux_layer_ids)} aux layer ids were given",
                    fix="make decisions.aux_layer_ids match the head",
                )
            if head.cfg.hidden_size != target.config.hidden_size:
                raise InputError(
                    f"draft hidden size {head.cfg.hidden_size} != target hidden size {target.config.hidden_size}",
                    fix="use a head trained for this target",
                )
        tokenizer = load_tokenizer(target_dir)
        return cls(target, head, tokenizer, drafter, eos_ids(target_dir, tokenizer))

    @classmethod
    def from_convert_manifest(cls, manifest: dict[str, Any], device: str = "auto", dtype: str = "auto",
                              drafter: str = "eagle") -> "ReferenceDecoder":
        artifacts = manifest.get("artifacts") or {}
        decisions = manifest.get("decisions") or {}
        problems = []
        if not artifacts.get("target_dir"):
            problems.append("artifacts.target_dir is missing")
        if drafter == "eagle" and not artifacts.get("draft_dir"):
            problems.append("artifacts.draft_dir is missing")
        if drafter == "eagle" and not decisions.get("aux_layer_ids"):
            problems.append("decisions.aux_layer_ids is missing")
        if problems:
            raise InputError(f"convert manifest is incomplete: {'; '.join(problems)}",
                             fix="re-run `specconvert convert RECIPE --force`", problems=problems)
        if dtype == "auto":
            dtype = (manifest.get("target") or {}).get("dtype") or "auto"
        return cls.from_dirs(artifacts["target_dir"], artifacts.get("draft_dir"), decisions.get("aux_layer_ids"),
                             device=device, dtype=dtype, drafter=drafter,
                             norm_layout=decisions.get("draft_norm_layout", "eagle3"))

    # ------------------------------------------------------------------ decoding

    def _sync(self) -> None:
        if self.target.device.type == "cuda":
            torch.cuda.synchronize()

    def _choose(self, logits: torch.Tensor, settings: DecodeSettings, gen: torch.Generator) -> int:
        if settings.greedy:
            return int(logits.argmax())
        return sample_token(logits.cpu(), settings.temperature, settings.top_k, settings.top_p, gen)

    def _oracle_sequence(self, prompt: torch.Tensor, n_tokens: int) -> list[int]:
        """The target's greedy continuation, computed with the plain path before timing starts."""
        greedy = DecodeSettings(speculative=False)
        toks = [t for step in self._plain(prompt, n_tokens, greedy, torch.Generator(), stop=()) for t in step.token_ids]
        return prompt.tolist() + toks

    def _oracle_resync(self, text: list[int], n_tokens: int) -> None:
        """Verification's numerics (many tokens per forward) can pick a different argmax than the
        one-token path at a near-tie (bf16); the oracle then re-derives the continuation of the
        text actually emitted, on a side cache, outside the timed region."""
        t0 = time.perf_counter()
        saved = self.target.cache
        try:
            self._oracle.sequence = self._oracle_sequence(torch.tensor(text), n_tokens)
        finally:
            self.target.cache = saved
        self.oracle_prep_time_s += time.perf_counter() - t0

    def stream(self, prompt_ids: Sequence[int], max_new_tokens: int, settings: DecodeSettings | None = None) -> Iterator[Step]:
        """Yield one :class:`Step` per target forward, with the tokens it emitted."""
        settings = settings or DecodeSettings()
        prompt = torch.as_tensor(list(prompt_ids), dtype=torch.long)
        if prompt.numel() == 0:
            raise InputError("empty prompt", fix="give at least one prompt token")
        if max_new_tokens <= 0:
            return
        gen = torch.Generator()
        if settings.seed is not None:
            gen.manual_seed(int(settings.seed))
        else:
            gen.seed()
        stop = tuple(int(s) for s in settings.stop_token_ids)
        speculative = settings.speculative and self.drafter_kind != "none"
        if not speculative:
            yield from self._plain(prompt, max_new_tokens, settings, gen, stop)
            return
        shape = settings.shape()
        if self._oracle is not None:
            t0 = time.perf_counter()
            self._oracle.reset(self._oracle_sequence(prompt, max_new_tokens + shape.depth))
            self.oracle_prep_time_s = time.perf_counter() - t0
        yield from self._speculate(prompt, max_new_tokens, settings, shape, gen, stop)

    def _finish(self, tokens: list[int], emitted: int, max_new: int, stop: tuple[int, ...]) -> tuple[list[int], str | None]:
        room = max_new - emitted
        out = tokens[:room]
        for i, t in enumerate(out):
            if t in stop:
                return out[: i + 1], "stop"
        return out, ("length" if emitted + len(out) >= max_new else None)

    def _prefill(self, prompt: torch.Tensor, settings, gen, capture: bool):
        target = self.target
        target.reset()
        self._sync()
        t0 = time.perf_counter()
        out = target.forward(prompt, torch.arange(prompt.numel()), logits_to_keep=1, capture=capture)
        tok = self._choose(out.logits[-1], settings, gen)
        self._sync()
        return out, tok, time.perf_counter() - t0

    def _plain(self, prompt, max_new, settings, gen, stop) -> Iterator[Step]:
        target = self.target
        out, tok, dt = self._prefill(prompt, settings, gen, capture=False)
        toks, fin = self._finish([tok], 0, max_new, stop)
        yield Step("prefill", toks, 0, 0, 0, 0.0, dt, fin,
                   logprobs=token_logprobs(out.logits[-1:], toks, settings.logprobs))
        emitted, pos = 1, prompt.numel()
        ids, positions = torch.empty(1, dtype=torch.long), torch.empty(1, dtype=torch.long)
        while fin is None:
            t0 = time.perf_counter()
            ids[0], positions[0] = tok, pos
            out = target.forward(ids, positions, logits_to_keep=1, capture=False)
            tok = self._choose(out.logits[-1], settings, gen)
            self._sync()
            pos += 1
            toks, fin = self._finish([tok], emitted, max_new, stop)
            emitted += len(toks)
            yield Step("plain", toks, 0, 0, 0, 0.0, time.perf_counter() - t0, fin,
                       logprobs=token_logprobs(out.logits[-1:], toks, settings.logprobs))

    def _speculate(self, prompt, max_new, settings, shape: TreeShape, gen, stop) -> Iterator[Step]:
        target, eagle, oracle = self.target, self._eagle, self._oracle
        out, tok, dt = self._prefill(prompt, settings, gen, capture=eagle is not None)
        toks, fin = self._finish([tok], 0, max_new, stop)
        draft_t = 0.0
        if fin is None and eagle is not None:
            t0 = time.perf_counter()
            eagle.reset()
            eagle.commit(out.aux, torch.cat((prompt[1:], torch.tensor([tok]))))
            self._sync()
            draft_t = time.perf_counter() - t0
        yield Step("prefill", toks, 0, 0, 0, draft_t, dt, fin,
                   logprobs=token_logprobs(out.logits[-1:], toks, settings.logprobs))
        emitted, pos, root = 1, prompt.numel(), tok
        zero = torch.zeros(1, dtype=torch.long)
        text = prompt.tolist() + [tok]  # oracle only: what has been emitted so far
        while fin is None:
            step_shape = shape.capped(max_new - emitted - 1)
            if oracle is not None and oracle.sequence[: len(text)] != text:
                self._oracle_resync(text, step_shape.depth + max_new - emitted)
            t0 = time.perf_counter()
            if eagle is not None:
                tree = eagle.draft(step_shape)
            else:
                tree = oracle.draft(step_shape, pos)
            self._sync()
            t1 = time.perf_counter()
            ids = torch.cat((torch.tensor([root]), tree.tokens))
            positions = pos + torch.cat((zero, tree.depths))
            out = target.forward(ids, positions, tree_mask=tree.ancestors if tree.size else None, capture=eagle is not None)
            logits = out.logits.cpu()
            t_fwd = time.perf_counter()
            if settings.greedy:
                verdict = verify_greedy(tree, logits)
            else:
                verdict = verify_sampling(tree, logits, settings.temperature, settings.top_k, settings.top_p, gen)
            t_acc = time.perf_counter()
            target.keep(pos, verdict.path)
            self._sync()
            t2 = time.perf_counter()
            toks, fin = self._finish(verdict.tokens, emitted, max_new, stop)
            emitted += len(toks)
            if fin is None and eagle is not None:
                eagle.commit(out.aux[verdict.path.to(out.aux.device)], torch.tensor(verdict.tokens))
                self._sync()
            t3 = time.perf_counter()
            pos += verdict.path.numel()
            root = verdict.tokens[-1]
            if oracle is not None:
                text += verdict.tokens
            depth = int(tree.depths.max()) if tree.size else 0
            phases = {"draft": t1 - t0, "target_forward": t_fwd - t1, "accept": t_acc - t_fwd,
                      "cache_update": t2 - t_acc, "commit": t3 - t2}
            # Row path[i] of the verify block is the target's prediction of the i-th emitted token.
            yield Step("spec", toks, verdict.accepted, depth, tree.size, (t1 - t0) + (t3 - t2), t2 - t1, fin, phases,
                       logprobs=token_logprobs(logits[verdict.path], toks, settings.logprobs))

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, settings: DecodeSettings | None = None) -> GenerateResult:
        """Run :meth:`stream` to the end and summarise it."""
        settings = settings or DecodeSettings()
        t0 = time.perf_counter()
        records = list(self.stream(prompt_ids, max_new_tokens, settings))
        wall = time.perf_counter() - t0 - (self.oracle_prep_time_s if self._oracle is not None and settings.speculative else 0.0)
        return summarise(list(prompt_ids), records, wall)


def summarise(prompt_ids: list[int], records: list[Step], wall: float) -> GenerateResult:
    tokens = [t for r in records for t in r.token_ids]
    steps = [r for r in records if r.kind != "prefill"]
    spec = [r for r in steps if r.kind == "spec"]
    accepted = [r.accepted for r in spec]
    tau = (sum(a + 1 for a in accepted) / len(accepted)) if accepted else 1.0
    max_depth = max((r.drafted_depth for r in spec), default=0)
    per_pos = []
    for i in range(max_depth):
        tried = [r for r in spec if r.drafted_depth > i]
        per_pos.append(sum(1 for r in tried if r.accepted > i) / len(tried) if tried else 0.0)
    prefill = sum(r.verify_time_s for r in records if r.kind == "prefill")
    return GenerateResult(
        prompt_token_ids=prompt_ids,
        token_ids=tokens,
        steps=len(steps),
        accepted_per_step=accepted,
        acceptance_length=tau,
        per_position_acceptance=per_pos,
        tokens_per_second=len(tokens) / wall if wall > 0 else 0.0,
        draft_time_s=sum(r.draft_time_s for r in records),
        verify_time_s=sum(r.verify_time_s for r in records if r.kind != "prefill"),
        prefill_time_s=prefill,
        wall_time_s=wall,
        finish_reason=records[-1].finished if records else None,
        step_records=records,
    )
