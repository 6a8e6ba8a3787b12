"""Public ``config.json`` facts of real targets, for simulation tests: shapes without weights.

Written from the published model cards and configs (meta-llama/Llama-3.1-8B-Instruct,
meta-llama/Llama-3.3-70B-Instruct on the Hugging Face hub; DESIGN §7). Nothing here is downloaded.
:func:`write_config_only_model` makes a folder holding ``config.json`` alone: what `plan`, build and the
placement code read, and what no test may load weights from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_LLAMA3_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192, "rope_type": "llama3"}
_LLAMA3_COMMON = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
    "initializer_range": 0.02, "max_position_embeddings": 131072, "mlp_bias": False, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": _LLAMA3_ROPE, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 128256,
}

LLAMA_31_8B_INSTRUCT: dict[str, Any] = {
    **_LLAMA3_COMMON, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "head_dim": 128,
}

LLAMA_33_70B_INSTRUCT: dict[str, Any] = {
    **_LLAMA3_COMMON, "hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64,
    "num_hidden_layers": 80, "num_key_value_heads": 8, "head_dim": 128,
}

REAL_CONFIGS = {"llama3.1-8b-instruct": LLAMA_31_8B_INSTRUCT, "llama3.3-70b-instruct": LLAMA_33_70B_INSTRUCT}


def write_config_only_model(root: Path, config: dict[str, Any] | str, name: str | None = None) -> Path:
    """``root/<name>/config.json`` and nothing else (no weights, no tokenizer); ``config``: a dict or a key of
    :data:`REAL_CONFIGS`. Returns the folder."""
    if isinstance(config, str):
        name = name or config
        config = REAL_CONFIGS[config]
    folder = Path(root) / (name or "model")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return folder

# The names `plan`'s tests use.
LLAMA_3_1_8B_INSTRUCT = LLAMA_31_8B_INSTRUCT
LLAMA_3_3_70B_INSTRUCT = LLAMA_33_70B_INSTRUCT


def write_config_only(tmp_path: Path, config: dict[str, Any], name: str = "model") -> Path:
    """``tmp_path/<name>/config.json`` alone (the signature `plan`'s tests use)."""
    return write_config_only_model(tmp_path, config, name)
