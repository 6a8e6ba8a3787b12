"""The training loop: Model Optimizer's EAGLE-3 module in offline mode, plain PyTorch.

Why offline: the target's features (aux-layer hidden states and the final hidden
state) are computed here once per sequence and kept in memory, so later epochs skip
the target forward. Model Optimizer computes the loss (distillation of the target's
distribution under ``loss_mask``) and the per-position training accuracy over
``eagle_ttt_steps`` training-time-test steps.

Two Model Optimizer details are handled here:

- its training-time-test attention masks are cached by step only; with batches of
  different lengths that would reuse a mask of the wrong size, so the cache is kept
  per sequence length;
- its first draft layer normalises the target feature twice
  (``hidden_norm(input_layernorm(h))``) where runtimes normalise once; the first
  layer's ``input_layernorm`` is frozen at 1, which makes the two identical, so the
  exported head computes in TensorRT-LLM exactly what it was trained to compute.

Checkpoints (head, optimizer, schedule, elapsed time, best head) are written every
``checkpoint_every`` steps as safetensors plus JSON (``checkpoint.py``: nothing from a
cache is ever unpickled); a rerun with the same data and settings resumes from the
last one, and the budget counts the time of every run together.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import output
from .._imports import require
from .data import TrainSequence

_FEATURE_CACHE_GIB = 8.0  # target features kept in RAM up to this size; beyond it they are recomputed per epoch


@dataclass
class TrainResult:
    tensors: dict[str, Any]  # canonical head tensors (best checkpoint)
    steps: int
    total_steps: int
    stopped_by: str  # "steps" | "budget" | "cached"
    train_s: float
    best_step: int
    best_score: float
    history: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: int = 0
    # torch's intra-op thread counts the steps ran with, in order: the head's bits depend on them
    # (threads.py, module doc), so two heads of the same seed are comparable only at the same counts.
    threads: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "total_steps": self.total_steps,
            "stopped_by": self.stopped_by,
            "train_s": round(self.train_s, 2),
            "best_step": self.best_step,
            "best_heldout_tau_estimate": round(self.best_score, 4),
            "resumed_from_step": self.resumed_from,
            "intra_op_threads": self.threads,
            "history": self.history,
        }


def tau_estimate(accs: Sequence[float]) -> float:
    """Expected chain acceptance length from per-position draft accuracies: 1 + a0 + a0*a1 + ..."""
    total, run = 1.0, 1.0
    for a in accs:
        run *= float(a)
        total += run
    return total


class FeatureExtractor:
    """Target forward returning (aux hidden states concatenated, final hidden state)."""

    def __init__(self, model: Any, aux_layer_ids: Sequence[int]):
        from ..reference.target import find_layers

        self.model = model
        self.base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        self.aux_layer_ids = list(aux_layer_ids)
        self._captured: dict[int, Any] = {}
        layers = find_layers(model)
        self._handles = [layers[i].register_forward_hook(self._hook(i)) for i in self.aux_layer_ids]

    def _hook(self, index: int):
        def hook(module, args, out):
            self._captured[index] = out[0] if isinstance(out, tuple) else out

        return hook

    def __call__(self, input_ids: Any, attention_mask: Any) -> tuple[Any, Any]:
        torch = require("torch")
        self._captured.clear()
        with torch.no_grad():
            final = self.base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        aux = torch.cat([self._captured[i] for i in self.aux_layer_ids], dim=-1)
        self._captured.clear()
        return aux, final

    def even_out(self, forwards: int) -> int:
        """Called before a batch's ``forwards`` target forwards; a sharded target pads the processes to the same count there."""
        return 0

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def _full(tensor: Any) -> Any:
    """A whole tensor: a sharded target's weights (DTensors, ``sharded``) are gathered (collective)."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _canonical_state(model: Any) -> dict[str, Any]:
    from ..backends.modelopt.eagle import head_state

    return {k: v.detach().cpu().clone() for k, v in head_state(model).items()}


def build_train_model(target: Any, arch: Any, aux_layer_ids: list[int], used_ids: list[int], ttt_steps: int,
                      dtype: Any, device: Any, seed: int) -> Any:
    """Model Optimizer's EAGLE-3 training model (offline mode) around the target's embeddings and lm_head.

    Built on a weightless skeleton: only embeddings, final norm and lm_head are
    materialised (copied from ``target``), the decoder layers are never allocated.
    The head starts at Model Optimizer's std-0.02 normal init; :func:`init_from_target_layer`
    can then start its layer from the target's.
    """
    torch = require("torch")
    transformers = require("transformers")
    accelerate = require("accelerate")
    from ..backends.modelopt import eagle

    config = target.config.__class__.from_dict(target.config.to_dict())
    with accelerate.init_empty_weights():
        skeleton = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    skeleton.config.architectures = list(getattr(target.config, "architectures", None) or [type(target).__name__])
    eagle.attach_eagle(skeleton, arch, aux_layer_ids, training={"eagle_offline": True, "eagle_ttt_steps": ttt_steps})
    skeleton.to_empty(device=device)
    base_state = {k: _full(v) for k, v in target.state_dict().items() if not k.startswith(("model.layers.",))}
    own = skeleton.state_dict()
    with torch.no_grad():
        for name, value in base_state.items():
            if name in own and tuple(own[name].shape) == tuple(value.shape):
                own[name].copy_(value.to(own[name].dtype))
    _init_head(skeleton, target, used_ids, seed)
    # The trainer hands Model Optimizer the target's logits already restricted to the draft
    # vocabulary (a softmax over those rows is exactly what it computes after its own d2t
    # mapping, at a sixth of the cost for SmolLM2), so it must not map them again.
    skeleton.eagle_config.vocab_size = len(used_ids)
    skeleton.to(device)
    return skeleton


def _init_head(model: Any, target: Any, used_ids: list[int], seed: int) -> None:
    torch = require("torch")
    module = model.eagle_module
    gen = torch.Generator().manual_seed(seed)
    std = getattr(target.config, "initializer_range", 0.02) or 0.02
    lm_head = _full(target.get_output_embeddings().weight.detach())
    used = torch.tensor(used_ids, dtype=torch.long)
    with torch.no_grad():
        for name, tensor in module.state_dict(keep_vars=True).items():
            if name.endswith("inv_freq"):
                continue
            if name == "d2t":
                tensor.copy_(used - torch.arange(len(used_ids)))
            elif name == "lm_head.weight":
                # Start from the target's own output rows: the head begins by predicting
                # "the token the target's final layer would pick from this feature".
                tensor.copy_(lm_head[used.to(lm_head.device)].to(tensor.dtype))
            elif tensor.dim() == 1:
                tensor.fill_(1.0)
            elif tensor.dim() >= 2:
                tensor.copy_((torch.randn(tensor.shape, generator=gen) * std).to(tensor.dtype))
            else:
                tensor.zero_()
    # hidden_norm(input_layernorm(h)) == hidden_norm(h) only while this weight stays 1 (module doc).
    module.layers[0].input_layernorm.weight.requires_grad_(False)
    for p in model.parameters():
        p.requires_grad_(False)
    for name, p in module.named_parameters():
        if name != "layers.0.input_layernorm.weight":
            p.requires_grad_(True)


def target_layer_for(aux_layer_ids: Sequence[int], num_layers: int) -> int:
    """The target layer a ``layer_init: target`` head starts from: the one after the deepest feature it reads.

    Aux ids are layer outputs (the ``output`` convention every caller converts to), so
    layer ``max + 1`` is the one whose input is the deepest feature; the last layer when
    that feature is the last layer's own output.
    """
    return min(max(aux_layer_ids) + 1, num_layers - 1)


# The draft layer's tensors that must take the target layer's values for the start to mean anything.
_TARGET_INIT_REQUIRED = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                         "self_attn.o_proj.weight")


def check_target_layer(target: Any, aux_layer_ids: Sequence[int]) -> int:
    """The layer index ``layer_init: target`` starts from; refuses (before any synthesis) a target without its tensors."""
    from ..errors import InputError
    from ..reference.target import find_layers

    layers = find_layers(target)
    index = target_layer_for(aux_layer_ids, len(layers))
    names = set(layers[index].state_dict())
    missing = [n for n in _TARGET_INIT_REQUIRED if n not in names]
    if missing:
        raise InputError(
            f"draft.train.layer_init: target: layer {index} of the target ({type(layers[index]).__name__}) has no "
            f"{', '.join(missing)}, so the draft layer cannot start from it",
            fix="set draft.train.layer_init: random",
        )
    return index


def init_from_target_layer(model: Any, target: Any, aux_layer_ids: Sequence[int]) -> dict[str, Any]:
    """Start the head as "the target's next layer on the deepest feature" (``draft.train.layer_init: target``).

    The draft layer takes the weights of target layer ``L = target_layer_for(aux)``:
    the feature half of its q/k/v projections (Model Optimizer feeds the first attention
    ``cat(embeddings, hidden_norm(h))``, so the second half reads the feature), o_proj,
    the MLP and the post-attention norm, with ``hidden_norm`` from L's input norm (the
    draft's own ``input_layernorm`` stays frozen at 1, module doc); the head's final norm
    takes the target's. ``fc`` becomes 0.1 x its random start plus the identity on the
    deepest feature's block, so the fused feature starts as that feature. The embedding
    half of q/k/v keeps its random start. Every other tensor of L whose name and shape
    match is copied too (biases of targets that have them); the attention projections
    must match, or the target's layers are not the draft's kind and this refuses.
    Returns what was copied, for the manifest.
    """
    torch = require("torch")
    from ..backends.modelopt.eagle import generation, module_name
    from ..errors import InputError
    from ..reference.target import find_layers

    index = check_target_layer(target, aux_layer_ids)
    src = {k: _full(v.detach()) for k, v in find_layers(target)[index].state_dict().items()}
    module = model.eagle_module
    gen = generation()
    own = module.state_dict(keep_vars=True)
    hidden = int(target.config.hidden_size)
    copied: list[str] = []
    with torch.no_grad():
        for name, value in src.items():
            dest = module_name("layers.0.hidden_norm.weight" if name == "input_layernorm.weight" else f"layers.0.{name}", gen)
            tensor = own.get(dest)
            if tensor is None:
                continue
            if tuple(tensor.shape) == tuple(value.shape):
                tensor.copy_(value.to(tensor.dtype))
            elif (name in _TARGET_INIT_REQUIRED[:3] and tensor.dim() == 2 and tensor.shape[0] == value.shape[0]
                  and tensor.shape[1] == 2 * value.shape[1] == 2 * hidden):
                tensor[:, hidden:].copy_(value.to(tensor.dtype))  # the feature half; the embedding half stays random
            else:
                continue
            copied.append(name)
        missing = [n for n in _TARGET_INIT_REQUIRED if n not in copied]
        if missing:
            raise InputError(
                f"draft.train.layer_init: target: {', '.join(missing)} of the target's layer {index} do not have the "
                f"draft layer's shapes, so the draft layer cannot start from it",
                fix="set draft.train.layer_init: random",
            )
        base = target.get_decoder() if hasattr(target, "get_decoder") else getattr(target, "model", None)
        final_norm = getattr(base, "norm", None)
        norm = getattr(module, "norm", None)
        if final_norm is not None and norm is not None and tuple(norm.weight.shape) == tuple(final_norm.weight.shape):
            norm.weight.copy_(_full(final_norm.weight.detach()).to(norm.weight.dtype))
            copied.append("final norm")
        fc = module.fc.weight
        block = list(aux_layer_ids).index(max(aux_layer_ids))  # the features are concatenated in aux order
        fc.mul_(0.1)
        fc[:, block * hidden:(block + 1) * hidden] += torch.eye(hidden, dtype=fc.dtype, device=fc.device)
    return {"target_layer": index, "copied": copied}


@dataclass
class _Batch:
    input_ids: Any
    attention_mask: Any
    loss_mask: Any
    aux: Any
    final: Any
    tokens: int


class Trainer:
    """One training run of a ``draft.train`` block (see module doc)."""

    def __init__(self, train: Any, train_model: Any, features: FeatureExtractor, sequences: list[TrainSequence],
                 holdout: list[TrainSequence], device: Any, dtype: Any, checkpoint_path: Path, fingerprint: str,
                 world: Any = None, autocast: Any = None):
        from .distributed import World

        torch = require("torch")
        self.world = world or World()
        self.spec = train
        self.model = train_model
        self.features = features
        self.sequences = sequences
        self.holdout = holdout
        self.device = device
        self.dtype = dtype
        # bf16-mixed: float32 weights, optimizer and target logits; the head's forward (and so its backward) in bf16
        self.autocast = autocast
        self.checkpoint_path = checkpoint_path
        self.fingerprint = fingerprint
        # One optimizer step consumes one batch per process (a global batch of batch_size x processes).
        self.batches_per_epoch = max(1, math.ceil(len(sequences) / (train.batch_size * self.world.size)))
        if train.steps is not None:
            self.total_steps = int(train.steps)
        else:
            self.total_steps = max(1, math.ceil((train.epochs or 1.0) * self.batches_per_epoch))
        self.params = [p for p in train_model.eagle_module.parameters() if p.requires_grad]
        module = train_model.eagle_module
        used = torch.arange(module.d2t.numel(), device=module.d2t.device) + module.d2t if hasattr(module, "d2t") else None
        lm_head = train_model.get_output_embeddings().weight.detach()
        self._draft_rows = (lm_head[used.to(lm_head.device)] if used is not None else lm_head).to(dtype)
        self.optimizer = torch.optim.AdamW(self.params, lr=train.lr, betas=(0.9, 0.95), weight_decay=0.0)
        self.budget_s = train.max_minutes * 60 if train.max_minutes else None
        self._masks: dict[int, dict] = {}
        tokens = sum(len(s.input_ids) for s in sequences) + sum(len(s.input_ids) for s in holdout)
        width = (len(features.aux_layer_ids) + 1) * train_model.config.hidden_size
        self._cache_features = tokens * width * torch.finfo(dtype).bits / 8 / 2**30 <= _FEATURE_CACHE_GIB
        self._feature_cache: dict[tuple[str, int], tuple[Any, Any]] = {}
        self.step = 0
        self.elapsed_s = 0.0
        self.history: list[dict[str, Any]] = []
        self.best: dict[str, Any] = {"score": -1.0, "step": 0, "state": None}
        self.resumed_from = 0
        self.threads: list[int] = []

    def lr_factor(self) -> float:
        """Linear warm-up, then cosine decay to 10 %.

        With ``steps`` the schedule follows the step count alone and ``max_minutes`` is only
        a safety cap: the same seed and steps give the same head on a quiet laptop and a
        loaded CI runner. Without ``steps`` (``epochs`` with a budget) it follows whichever
        ends first, the steps or the budget, so a run cut by ``max_minutes`` still ends at
        the low learning rate instead of in the middle of the decay.
        """
        progress = self.step / self.total_steps
        if self.budget_s and self.spec.steps is None:
            progress = max(progress, self.elapsed_s / self.budget_s)
        progress = min(1.0, progress)
        if progress < 0.05:
            return max(progress, 1.0 / self.total_steps) / 0.05
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (progress - 0.05) / 0.95))

    # ------------------------------------------------------------------ data

    def _order(self, epoch: int) -> list[int]:
        """Deterministic per-epoch order; batches are length-sorted within groups of 8 to cut padding."""
        rng = random.Random(self.spec.seed * 1000003 + epoch)
        order = list(range(len(self.sequences)))
        rng.shuffle(order)
        group = self.spec.batch_size * 8
        chunks = [sorted(order[i: i + group], key=lambda k: len(self.sequences[k].input_ids)) for i in range(0, len(order), group)]
        batches = [c[i: i + self.spec.batch_size] for c in chunks for i in range(0, len(c), self.spec.batch_size)]
        rng.shuffle(batches)
        return batches  # type: ignore[return-value]

    def _features(self, kind: str, index: int, seq: TrainSequence) -> tuple[Any, Any]:
        key = (kind, index)
        if key in self._feature_cache:
            return self._feature_cache[key]
        torch = require("torch")
        ids = torch.tensor([seq.input_ids], device=self.device)
        aux, final = self.features(ids, torch.ones_like(ids))
        pair = (aux[0].to(self.dtype), final[0].to(self.dtype))
        if self._cache_features:
            self._feature_cache[key] = pair
        return pair

    def _batch(self, kind: str, indices: Sequence[int], pool: list[TrainSequence]) -> _Batch:
        torch = require("torch")
        seqs = [pool[i] for i in indices]
        width = max(len(s.input_ids) for s in seqs)
        n = len(seqs)
        ids = torch.zeros((n, width), dtype=torch.long)
        attn = torch.zeros((n, width), dtype=torch.long)
        mask = torch.zeros((n, width), dtype=self.dtype)
        hidden = self.model.config.hidden_size
        aux = torch.zeros((n, width, hidden * len(self.features.aux_layer_ids)), dtype=self.dtype, device=self.device)
        final = torch.zeros((n, width, hidden), dtype=self.dtype, device=self.device)
        self.features.even_out(sum((kind, i) not in self._feature_cache for i in indices))
        for row, (i, s) in enumerate(zip(indices, seqs)):
            length = len(s.input_ids)
            ids[row, :length] = torch.tensor(s.input_ids)
            attn[row, :length] = 1
            mask[row, :length] = torch.tensor(s.loss_mask, dtype=self.dtype)
            a, f = self._features(kind, i, s)
            aux[row, :length] = a
            final[row, :length] = f
        return _Batch(ids.to(self.device), attn.to(self.device), mask.to(self.device), aux, final, int(attn.sum()))

    def _forward(self, batch: _Batch) -> Any:
        # Model Optimizer caches its training-time-test masks by step only: keep one cache per length.
        self.model._cached_attn_blk_masks = self._masks.setdefault(int(batch.input_ids.shape[1]), {})
        torch = require("torch")
        with torch.no_grad():
            logits = batch.final @ self._draft_rows.T  # the target's logits over the draft vocabulary
        precision = (torch.autocast(self.device.type, dtype=self.autocast) if self.autocast is not None
                     else contextlib.nullcontext())
        with precision:
            return self.model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                loss_mask=batch.loss_mask,
                base_model_outputs={"base_model_hidden_states": batch.final, "aux_hidden_states": batch.aux,
                                    "base_model_logits": logits},
            )

    # ------------------------------------------------------------------ checkpoints

    def _save(self, complete: bool = False) -> None:
        if not self.world.main:
            return
        from . import checkpoint

        state = {
            "fingerprint": self.fingerprint,
            "step": self.step,
            "elapsed_s": self.elapsed_s,
            "history": self.history,
            "best_score": self.best["score"],
            "best_step": self.best["step"],
            "complete": complete,
            "threads": self.threads,
        }
        checkpoint.save(self.checkpoint_path, state, self.model.eagle_module.state_dict(), self.best["state"],
                        self.optimizer.state_dict())

    def load_checkpoint(self) -> dict[str, Any] | None:
        """Resume from the checkpoint when it belongs to this run (same data and settings).

        Nothing in the cache is ever unpickled (module doc of ``checkpoint``): a checkpoint
        that is not ours, or is cut, is reported and training starts over.
        """
        from . import checkpoint

        legacy = self.checkpoint_path.with_suffix(".pt")
        if legacy != self.checkpoint_path and legacy.is_file():
            output.log(f"draft.train: ignoring {legacy} (an older pickle checkpoint format, never loaded: pickles can "
                       f"run code); it can be deleted")
        if not self.checkpoint_path.is_file():
            return None
        try:
            if checkpoint.read_state(self.checkpoint_path).get("fingerprint") != self.fingerprint:
                return None
            state, head, best, optim = checkpoint.load(self.checkpoint_path)
            self._check_shapes(head, "head")
            if best is not None:
                self._check_shapes(best, "best head")
            step, elapsed = int(state["step"]), float(state["elapsed_s"])
            history, best_score, best_step = list(state["history"]), float(state["best_score"]), int(state["best_step"])
            used = [int(t) for t in state.get("threads", [])]  # absent in checkpoints written before it was recorded
            if len(optim["param_groups"]) != len(self.optimizer.param_groups):
                raise checkpoint.UnreadableCheckpoint("optimizer has other parameter groups")
        except (checkpoint.UnreadableCheckpoint, KeyError, TypeError, ValueError) as exc:
            output.warn(f"draft.train: checkpoint {self.checkpoint_path} is unreadable ({exc}); starting over")
            return None
        self.model.eagle_module.load_state_dict(head)
        self.optimizer.load_state_dict(optim)
        self.step, self.elapsed_s, self.history, self.threads = step, elapsed, history, used
        self.best = {"score": best_score, "step": best_step, "state": best}
        self.resumed_from = self.step
        return state

    def _check_shapes(self, tensors: dict[str, Any], what: str) -> None:
        from .checkpoint import UnreadableCheckpoint

        own = self.model.eagle_module.state_dict()
        if set(tensors) != set(own):
            raise UnreadableCheckpoint(f"{what} tensors differ from this head's")
        for name, value in tensors.items():
            if tuple(value.shape) != tuple(own[name].shape) or value.dtype != own[name].dtype:
                raise UnreadableCheckpoint(f"{what} tensor {name} has another shape or dtype")

    # ------------------------------------------------------------------ evaluation

    def evaluate_holdout(self) -> tuple[float, list[float]]:
        """Loss and per-position accuracy on the held-out sequences (training-time-test mode, no grad)."""
        torch = require("torch")
        pool = self.holdout or self.sequences[: max(1, self.spec.batch_size)]
        kind = "holdout" if self.holdout else "train"
        total_loss, weights, accs = 0.0, 0, None
        with torch.no_grad():
            for start in range(0, len(pool), self.spec.batch_size):
                idx = list(range(start, min(len(pool), start + self.spec.batch_size)))
                batch = self._batch(kind, idx, pool)
                out = self._forward(batch)
                w = int(batch.loss_mask.sum())
                total_loss += float(out.loss) * w
                step_accs = [float(a) for a in out.train_acc[0]]
                accs = [a * w for a in step_accs] if accs is None else [x + a * w for x, a in zip(accs, step_accs)]
                weights += w
        weights = max(1, weights)
        return total_loss / weights, [a / weights for a in (accs or [])]

    # ------------------------------------------------------------------ the loop

    def run(self, progress: Any, on_step: Callable[[int], None] | None = None) -> TrainResult:
        torch = require("torch")
        spec = self.spec
        budget_s = self.budget_s
        torch.manual_seed(spec.seed + self.step)
        now = torch.get_num_threads()
        if self.step < self.total_steps and (not self.threads or self.threads[-1] != now):
            if self.threads:
                output.warn(f"draft.train: resuming at step {self.step} with {now} torch threads where the checkpoint's steps "
                            f"ran with {self.threads[-1]}: the head is trained, but its bits differ from one trained "
                            f"throughout at either count (set runtime.threads to keep one)")
            self.threads.append(now)
        self.model.train()
        task = progress.add_task("train EAGLE-3 head", total=self.total_steps, completed=self.step)
        stopped_by = "steps"
        started = time.perf_counter() - self.elapsed_s
        loss_avg = None
        from .distributed import any_true, average_gradients

        world = self.world
        while self.step < self.total_steps:
            if any_true(budget_s is not None and time.perf_counter() - started >= budget_s, world):
                stopped_by = "budget"
                break
            epoch, pos = divmod(self.step, self.batches_per_epoch)
            batches = self._order(epoch)
            # this process's share of the global batch (wrapping round at the end of an epoch)
            indices = batches[(pos * world.size + world.rank) % len(batches)]
            batch = self._batch("train", indices, self.sequences)
            out = self._forward(batch)
            loss = out.loss
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            average_gradients(self.params, world)
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            for group in self.optimizer.param_groups:
                group["lr"] = spec.lr * self.lr_factor()
            self.optimizer.step()
            self.step += 1
            value = float(loss.detach())
            loss_avg = value if loss_avg is None else 0.9 * loss_avg + 0.1 * value
            accs = [round(float(a), 3) for a in out.train_acc[0]]
            progress.update(task, advance=1, description=f"train EAGLE-3 head  loss {loss_avg:.3f}  acc {accs}")
            self.elapsed_s = time.perf_counter() - started
            if self.step % spec.checkpoint_every == 0 or self.step == self.total_steps:
                self._checkpoint_eval(value, accs)
            if on_step:
                on_step(self.step)
        self.elapsed_s = time.perf_counter() - started
        if not self.history or self.history[-1]["step"] != self.step:
            self._checkpoint_eval(loss_avg if loss_avg is not None else float("nan"), [])
        self._save(complete=True)
        return self.result(stopped_by)

    def _checkpoint_eval(self, train_loss: float, train_accs: list[float]) -> None:
        self.model.train()
        loss, accs = self.evaluate_holdout()
        score = tau_estimate(accs)
        self.history.append({
            "step": self.step,
            "minutes": round(self.elapsed_s / 60, 3),
            "train_loss": round(train_loss, 4),
            "train_acc": train_accs,
            "heldout_loss": round(loss, 4),
            "heldout_acc": [round(a, 4) for a in accs],
            "heldout_tau_estimate": round(score, 4),
        })
        if score > self.best["score"]:
            self.best = {"score": score, "step": self.step,
                         "state": {k: v.detach().cpu().clone() for k, v in self.model.eagle_module.state_dict().items()}}
        self._save()

    def result(self, stopped_by: str) -> TrainResult:
        if self.best["state"] is not None:
            self.model.eagle_module.load_state_dict(self.best["state"])
        return TrainResult(
            tensors=_canonical_state(self.model),
            steps=self.step,
            total_steps=self.total_steps,
            stopped_by=stopped_by,
            train_s=self.elapsed_s,
            best_step=self.best["step"],
            best_score=self.best["score"],
            history=self.history,
            resumed_from=self.resumed_from,
            threads=list(self.threads),
        )
