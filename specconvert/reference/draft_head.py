"""The EAGLE-3 draft head (DESIGN §4), loaded from the canonical draft folder.

Owns the head's math and its own KV cache. The math is written out here (not
borrowed from a transformers decoder layer) so that the order of operations is
explicit and auditable:

    x      = fc(cat(aux_low, aux_mid, aux_high))            # 3H -> H, target features only
    attn_in = cat(input_layernorm(emb(token)), hidden_norm(h))   # 2H
    h      = h + o_proj(attn(attn_in))                        # residual on the un-normed h
    h      = h + mlp(post_attention_layernorm(h))
    logits = lm_head(norm(h))   (draft vocab; target id = draft id + d2t[draft id])

and the pre-norm ``h`` is fed back as the hidden input of the next draft step.

``norm_layout="modelopt-hf"`` reproduces Model Optimizer 0.47's HF training module
instead: there the transformers decoder layer applies ``input_layernorm`` to ``h``
before the attention pre-hook applies ``hidden_norm`` to that, so the hidden half is
``hidden_norm(input_layernorm(h))``. The two agree when ``input_layernorm`` is the
identity scale (a fresh head) and drift apart once it is trained; deployment
runtimes (TensorRT-LLM, vLLM, SGLang, EAGLE's own code) compute the default layout.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError

NORM_LAYOUTS = ("eagle3", "modelopt-hf")

_REQUIRED = (
    "fc.weight",
    "layers.0.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight",
    "layers.0.self_attn.o_proj.weight",
    "layers.0.mlp.gate_proj.weight",
    "layers.0.mlp.up_proj.weight",
    "layers.0.mlp.down_proj.weight",
    "layers.0.input_layernorm.weight",
    "layers.0.hidden_norm.weight",
    "layers.0.post_attention_layernorm.weight",
    "norm.weight",
)


class RMSNorm(nn.Module):
    """Llama RMSNorm, computed in float32 like transformers' (bit-compatible)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.to(torch.float32)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)


class DraftKVCache:
    """Preallocated K/V for the head's single layer; ``length`` entries are live.

    Appending writes in place (amortised doubling), cropping only moves ``length``:
    no per-step allocation once warm.
    """

    def __init__(self, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device, capacity: int = 256):
        self.k = torch.empty(1, num_kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.v = torch.empty_like(self.k)
        self.length = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = k.shape[2]
        need = self.length + n
        if need > self.k.shape[2]:
            cap = max(need, 2 * self.k.shape[2])
            for name in ("k", "v"):
                old = getattr(self, name)
                new = old.new_empty(old.shape[0], old.shape[1], cap, old.shape[3])
                new[:, :, : self.length] = old[:, :, : self.length]
                setattr(self, name, new)
        self.k[:, :, self.length : need] = k
        self.v[:, :, self.length : need] = v
        self.length = need
        return self.k[:, :, :need], self.v[:, :, :need]

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)


@dataclass
class DraftConfig:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    hidden_act: str
    vocab_size: int
    draft_vocab_size: int
    num_aux: int
    aux_layer_ids: list[int] | None
    raw: dict[str, Any]

    @classmethod
    def from_dict(cls, cfg: dict[str, Any], num_aux: int) -> "DraftConfig":
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        eagle = cfg.get("eagle_config") or {}
        return cls(
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate_size=int(cfg["intermediate_size"]),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            hidden_act=str(cfg.get("hidden_act", "silu")),
            vocab_size=int(cfg["vocab_size"]),
            draft_vocab_size=int(cfg.get("draft_vocab_size") or cfg["vocab_size"]),
            num_aux=num_aux,
            aux_layer_ids=eagle.get("eagle_aux_hidden_state_layer_ids"),
            raw=cfg,
        )


def _rotary(cfg: dict[str, Any]) -> nn.Module:
    """transformers' Llama rotary embedding built from the head's config.json.

    Reusing it keeps every ``rope_scaling`` type (default, linear, llama3, yarn, ...)
    identical to what Model Optimizer trained with and what the runtimes read.
    """
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    keep = {
        k: v
        for k, v in cfg.items()
        if k not in ("eagle_config", "architectures", "torch_dtype", "dtype", "transformers_version", "draft_vocab_size")
    }
    if keep.get("rope_theta") is None:
        keep["rope_theta"] = 10000.0  # EAGLE official heads often omit it
    if not keep.get("rope_scaling"):
        keep.pop("rope_scaling", None)
    return LlamaRotaryEmbedding(config=LlamaConfig(**keep))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class DraftHead(nn.Module):
    """One EAGLE-3 decoder layer plus fc, norms, lm_head and d2t. Batch size 1."""

    def __init__(self, cfg: DraftConfig, norm_layout: str = "eagle3"):
        super().__init__()
        if norm_layout not in NORM_LAYOUTS:
            raise InputError(f"unknown draft norm layout '{norm_layout}'", fix=f"use one of {', '.join(NORM_LAYOUTS)}")
        from transformers.activations import ACT2FN

        self.cfg = cfg
        self.norm_layout = norm_layout
        H, nh, nkv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.fc = nn.Linear(cfg.num_aux * H, H, bias=False)
        self.q_proj = nn.Linear(2 * H, nh * hd, bias=False)
        self.k_proj = nn.Linear(2 * H, nkv * hd, bias=False)
        self.v_proj = nn.Linear(2 * H, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.gate_proj = nn.Linear(H, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(H, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, H, bias=False)
        self.act = ACT2FN[cfg.hidden_act]
        eps = cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(H, eps)
        self.hidden_norm = RMSNorm(H, eps)
        self.post_attention_layernorm = RMSNorm(H, eps)
        self.norm = RMSNorm(H, eps)
        self.lm_head = nn.Linear(H, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.rotary = _rotary(cfg.raw)

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_dir(
        cls,
        draft_dir: str | Path,
        num_aux: int = 3,
        target_lm_head: torch.Tensor | None = None,
        norm_layout: str = "eagle3",
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> "DraftHead":
        """Load the canonical (Model Optimizer export) layout: config.json + model.safetensors."""
        from safetensors.torch import load_file

        draft_dir = Path(draft_dir)
        cfg_path, weights = draft_dir / "config.json", draft_dir / "model.safetensors"
        if not cfg_path.is_file() or not weights.is_file():
            raise InputError(
                f"{draft_dir} is not a canonical EAGLE-3 draft folder (needs config.json and model.safetensors)",
                fix="point at <workdir>/convert/draft (run `specconvert convert RECIPE`)",
            )
        raw = json.loads(cfg_path.read_text(encoding="utf-8"))
        state = load_file(str(weights))
        missing = [k for k in _REQUIRED if k not in state]
        if missing:
            raise InputError(
                f"draft head in {draft_dir} lacks tensors: {', '.join(missing)}",
                fix="re-run `specconvert convert RECIPE --force` to write the canonical layout",
            )
        num_aux = state["fc.weight"].shape[1] // int(raw["hidden_size"])
        cfg = DraftConfig.from_dict(raw, num_aux=num_aux)
        head = cls(cfg, norm_layout=norm_layout)
        mapping = {
            "fc.weight": "fc.weight",
            "norm.weight": "norm.weight",
            "lm_head.weight": "lm_head.weight",
            "d2t": "d2t",
        }
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            mapping[f"layers.0.self_attn.{proj}.weight"] = f"{proj}.weight"
        for proj in ("gate_proj", "up_proj", "down_proj"):
            mapping[f"layers.0.mlp.{proj}.weight"] = f"{proj}.weight"
        for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
            mapping[f"layers.0.{norm}.weight"] = f"{norm}.weight"
        own = {}
        for src, dst in mapping.items():
            if src in state:
                own[dst] = state[src]
        if "lm_head.weight" not in own:
            if target_lm_head is None or target_lm_head.shape[0] != cfg.draft_vocab_size:
                raise InputError(
                    f"draft head in {draft_dir} has no lm_head and the target's cannot stand in "
                    f"(draft vocab {cfg.draft_vocab_size})",
                    fix="export the head with its lm_head.weight",
                )
            own["lm_head.weight"] = target_lm_head.detach()
        if "d2t" not in own:
            if cfg.draft_vocab_size != cfg.vocab_size:
                raise InputError(
                    f"draft vocab {cfg.draft_vocab_size} < target vocab {cfg.vocab_size} but {draft_dir} has no d2t",
                    fix="export the head with its d2t mapping",
                )
            own["d2t"] = torch.zeros(cfg.draft_vocab_size, dtype=torch.long)
        head.load_state_dict(own, strict=False)
        head.d2t = head.d2t.to(torch.long)
        head.eval()
        return head.to(device=device, dtype=dtype)

    def to(self, *args, **kwargs):  # keep d2t integral and the rotary inv_freq in float32
        module = super().to(*args, **kwargs)
        module.d2t = module.d2t.to(torch.long)
        module.rotary.inv_freq = module.rotary.inv_freq.to(torch.float32)
        return module

    # ------------------------------------------------------------------ math

    def new_cache(self, capacity: int = 256) -> DraftKVCache:
        p = self.q_proj.weight
        return DraftKVCache(self.cfg.num_key_value_heads, self.cfg.head_dim, p.dtype, p.device, capacity)

    def forward(
        self,
        hidden: torch.Tensor,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        cache: DraftKVCache | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One draft step over ``q`` inputs; returns the pre-norm hidden ``[1, q, H]``.

        ``hidden``: ``fc`` output (or the previous step's pre-norm hidden) ``[1, q, H]``;
        ``embeds``: target embeddings of the paired tokens ``[1, q, H]``; ``positions``
        ``[q]``; ``mask``: bool ``[q, kv_len]`` (True = attend) or None for causal.
        """
        q_len = hidden.shape[1]
        cfg = self.cfg
        h_in = self.input_layernorm(hidden) if self.norm_layout == "modelopt-hf" else hidden
        attn_in = torch.cat((self.input_layernorm(embeds.to(hidden.dtype)), self.hidden_norm(h_in)), dim=-1)
        q = self.q_proj(attn_in).view(1, q_len, cfg.num_attention_heads, cfg.head_dim).transpose(1, 2)
        k = self.k_proj(attn_in).view(1, q_len, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
        v = self.v_proj(attn_in).view(1, q_len, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
        cos, sin = self.rotary(hidden, positions.view(1, -1))
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if cache is not None:
            past = cache.length
            k, v = cache.append(k, v)
        else:
            past = 0
        if mask is None and q_len > 1:
            kv_len = k.shape[2]
            mask = torch.arange(kv_len, device=hidden.device)[None, :] <= (
                past + torch.arange(q_len, device=hidden.device)[:, None]
            )
        attn = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, enable_gqa=cfg.num_key_value_heads != cfg.num_attention_heads
        )
        attn = attn.transpose(1, 2).reshape(1, q_len, cfg.num_attention_heads * cfg.head_dim)
        h = hidden + self.o_proj(attn)
        x = self.post_attention_layernorm(h)
        return h + self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))

    def draft_logits(self, prenorm: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary."""
        return self.lm_head(self.norm(prenorm))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def target_logits(self, prenorm: torch.Tensor, target_vocab: int) -> torch.Tensor:
        """Draft logits scattered onto the target vocabulary (-inf where the draft vocab has no entry)."""
        logits = self.draft_logits(prenorm)
        full = logits.new_full((*logits.shape[:-1], target_vocab), float("-inf"))
        idx = self.to_target_ids(torch.arange(logits.shape[-1], device=logits.device))
        full[..., idx] = logits
        return full
