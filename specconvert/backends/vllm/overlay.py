"""What vLLM will run from a bundle's draft overlay (``engine/vllm/draft``), against the head convert wrote.

The overlay is a rewritten ``config.json`` beside links to the canonical draft's files. vLLM 0.32
(``vllm/model_executor/models/llama_eagle3.py``) reads from that config: the top-level
``eagle_aux_hidden_state_layer_ids`` (the *input* of layer k: output id + 1), and four keys that
change where norms apply (``norm_before_residual``, ``norm_output``, ``norm_before_fc``,
``fc_norm``; the heads we build are trained with none of them). The weights it loads must be the
head's own: ``d2t``, the norms. :func:`findings` lists each way the overlay departs from that, so
a failed oracle can name the concrete cause instead of a list of suspects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

NORM_LAYOUT_KEYS = ("norm_before_residual", "norm_output", "norm_before_fc", "fc_norm")


def findings(overlay: Path, draft_dir: Path, expected_aux_ids: list[int] | None) -> list[dict[str, str]]:
    """``[{"cause": aux_layers|d2t|norm, "detail": ...}]``: where ``overlay`` departs from ``draft_dir``."""
    out: list[dict[str, str]] = []
    try:
        config = json.loads((overlay / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return [{"cause": "aux_layers", "detail": f"{overlay / 'config.json'} unreadable: {exc}"}]
    # What vLLM runs: the top-level list, else eagle_config's, unshifted (gpu_model_runner.py,
    # _get_eagle3_aux_layers_from_config); build writes vLLM's numbering in both.
    top = config.get("eagle_aux_hidden_state_layer_ids")
    where, aux = ("eagle_aux_hidden_state_layer_ids", top) if top is not None else (
        "eagle_config.eagle_aux_hidden_state_layer_ids (vLLM's fallback: no top-level list)",
        (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids"))
    if expected_aux_ids is not None and aux != list(expected_aux_ids):
        out.append({"cause": "aux_layers", "detail": f"{overlay / 'config.json'}: {where} "
                    f"{aux}, expected {list(expected_aux_ids)} (vLLM numbering: convert's aux ids + 1)"})
    for key in NORM_LAYOUT_KEYS:
        if config.get(key) or (config.get("eagle_config") or {}).get(key):
            out.append({"cause": "norm", "detail": f"{overlay / 'config.json'}: {key} is set; the head was trained "
                        "without it"})
    out += _tensor_findings(overlay / "model.safetensors", Path(draft_dir) / "model.safetensors")
    return out


def _tensor_findings(served: Path, canonical: Path) -> list[dict[str, str]]:
    if not served.exists() or not canonical.exists():
        return []
    if served.resolve() == canonical.resolve():
        return []  # the overlay links the head's own file
    from safetensors import safe_open

    out = []
    with safe_open(str(served), "pt") as a, safe_open(str(canonical), "pt") as b:
        names_a, names_b = set(a.keys()), set(b.keys())
        for name in sorted(names_b - names_a):
            cause = "d2t" if name == "d2t" else ("norm" if "norm" in name else "weights")
            out.append({"cause": cause, "detail": f"{served}: {name} is missing (the engine runs a default)"})
        for name in sorted(names_a & names_b):
            if name != "d2t" and "norm" not in name:
                continue
            if not a.get_tensor(name).equal(b.get_tensor(name)):
                out.append({"cause": "d2t" if name == "d2t" else "norm",
                            "detail": f"{served}: {name} differs from the head's ({canonical})"})
    return out
