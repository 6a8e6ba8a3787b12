"""Public ``config.json`` facts of real targets, for simulations that load no weights.

Written from the published configs of meta-llama/Llama-3.1-8B-Instruct and
meta-llama/Llama-3.3-70B-Instruct (hub, late 2026). ``write_config_only`` makes a folder
holding nothing but that config: enough for ``specconvert plan`` and for meta-device models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LLAMA_3_1_8B_INSTRUCT: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rms_norm_eps": 1e-05,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
}

LLAMA_3_3_70B_INSTRUCT: dict[str, Any] = {
    **LLAMA_3_1_8B_INSTRUCT,
    "hidden_size": 8192,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "intermediate_size": 28672,
}


def write_config_only(tmp_path: Path, config: dict[str, Any], name: str = "model") -> Path:
    """A folder under ``tmp_path`` holding only ``config.json`` (no weights, no tokenizer)."""
    folder = Path(tmp_path) / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return folder
