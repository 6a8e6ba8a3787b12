"""The target (verifier) model: a transformers causal LM with aux-feature capture.

Owns the target's KV cache (a transformers ``DynamicCache``) and the three things
speculative decoding needs from the target that ``generate`` does not expose:
capture of the aux layers' outputs, a 4-D tree attention mask with explicit position
ids, and keeping an arbitrary accepted path of the cache (gather + crop).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..errors import InputError

_LAYER_PATHS = ("model.layers", "model.decoder.layers", "transformer.h", "gpt_neox.layers", "model.language_model.layers")


def find_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a causal LM, at the first of the known attribute paths that holds them."""
    for path in _LAYER_PATHS:
        obj = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        if isinstance(obj, nn.ModuleList):
            return obj
    raise InputError(
        f"cannot find the decoder layers of {type(model).__name__} (looked at {', '.join(_LAYER_PATHS)})",
        fix="use a Llama-family target, or add its layer path to specconvert/reference/target.py",
    )


@dataclass
class TargetOutput:
    logits: torch.Tensor  # [q, V] float32
    aux: torch.Tensor | None  # [q, n_aux * H] in the model dtype, low -> high


class TargetModel:
    """A causal LM plus its cache, driven one request at a time (batch size 1)."""

    def __init__(self, model: nn.Module, aux_layer_ids: list[int] | None = None):
        self.model = model.eval()
        self.config = model.config
        self.layers = find_layers(model)
        self.aux_layer_ids = list(aux_layer_ids or [])
        n = len(self.layers)
        bad = [i for i in self.aux_layer_ids if not 0 <= i < n]
        if bad:
            raise InputError(
                f"aux layer ids {bad} are outside the target's {n} decoder layers",
                fix="check decisions.aux_layer_ids in <workdir>/convert/manifest.json (output-of-layer convention, 0-based)",
            )
        self._captured: list[torch.Tensor | None] = [None] * len(self.aux_layer_ids)
        self._capture_on = False
        for slot, idx in enumerate(self.aux_layer_ids):
            self.layers[idx].register_forward_hook(self._make_hook(slot))
        self.cache = None
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.vocab_size = model.get_output_embeddings().weight.shape[0]

    @classmethod
    def from_dir(cls, target_dir: str | Path, aux_layer_ids: list[int] | None, dtype: torch.dtype, device: torch.device) -> "TargetModel":
        from transformers import AutoModelForCausalLM

        target_dir = Path(target_dir)
        if not (target_dir / "config.json").is_file():
            raise InputError(f"{target_dir} is not a Hugging Face model folder (no config.json)",
                             fix="point at <workdir>/convert/target (run `specconvert convert RECIPE`)")
        model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=dtype, attn_implementation="sdpa")
        return cls(model.to(device), aux_layer_ids)

    def _make_hook(self, slot: int):
        def hook(module, args, output):
            if self._capture_on:
                self._captured[slot] = output[0] if isinstance(output, (tuple, list)) else output

        return hook

    # ------------------------------------------------------------------ cache

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.config)

    @property
    def length(self) -> int:
        return 0 if self.cache is None else self.cache.get_seq_length()

    @torch.inference_mode()
    def keep(self, prefix: int, keep_idx: torch.Tensor) -> None:
        """Keep cache entries ``[:prefix]`` plus ``prefix + keep_idx`` (ascending), drop the rest.

        The accepted path is gathered in place over the tree block, then the cache is
        cropped; a contiguous path (every chain step) needs no gather at all.
        """
        m = int(keep_idx.numel())
        contiguous = bool((keep_idx == torch.arange(m, device=keep_idx.device)).all())
        if not contiguous:
            src = keep_idx.to(self.device) + prefix
            for layer in self.cache.layers:
                layer.keys[:, :, prefix : prefix + m] = layer.keys.index_select(2, src)
                layer.values[:, :, prefix : prefix + m] = layer.values.index_select(2, src)
        self.cache.crop(prefix + m)

    # ------------------------------------------------------------------ forward

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        tree_mask: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        capture: bool = True,
    ) -> TargetOutput:
        """Run ``input_ids`` ``[q]`` after the cached prefix, appending to the cache.

        ``tree_mask``: bool ``[q, q]`` (True = attend) over the new block; the cached
        prefix is always visible. None = causal. ``logits_to_keep``: 0 = all rows.
        """
        if self.cache is None:
            self.reset()
        q = input_ids.shape[-1]
        past = self.length
        attn = None
        if tree_mask is not None:
            neg = torch.finfo(self.dtype).min
            attn = torch.zeros(1, 1, q, past + q, dtype=self.dtype, device=self.device)
            attn[0, 0, :, past:].masked_fill_(~tree_mask.to(self.device), neg)
        self._capture_on = capture and bool(self.aux_layer_ids)
        try:
            out = self.model(
                input_ids=input_ids.view(1, q).to(self.device),
                position_ids=positions.view(1, q).to(self.device),
                attention_mask=attn,
                past_key_values=self.cache,
                use_cache=True,
                logits_to_keep=logits_to_keep,
            )
        finally:
            self._capture_on = False
        self.cache = out.past_key_values
        aux = None
        if capture and self.aux_layer_ids:
            aux = torch.cat([t[0] for t in self._captured], dim=-1)
            self._captured = [None] * len(self.aux_layer_ids)
        return TargetOutput(logits=out.logits[0].float(), aux=aux)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(token_ids.to(self.device))

    def lm_head_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight
