"""Integration bugs injected into a bundle's vLLM draft overlay (``engine/vllm/draft``), each one a
mistake that leaves vLLM starting and answering, losslessly, while acceptance quietly drops:

- ``aux-shift``: the aux-layer list in the *output* numbering (forgetting vLLM's +1), i.e. every
  captured layer one too early. Caught by the overlay's ``convention`` check (the layers vLLM captures
  by its reading rules against the head's own record) and its ``integrity`` check (the file differs
  from what build wrote); acceptance alone moves by about the tolerance;
- ``identity-d2t``: ``d2t`` all zeros, so draft token i is taken for target token i;
- ``norm-layout``: the draft layer's residual taken *after* ``hidden_norm`` instead of before it
  (vLLM's ``norm_before_residual: true`` in the draft config, ``vllm/model_executor/models/
  llama_eagle3.py``), a norm applied where the head was trained without it.

Not used: a dropped norm *scale* (``norm.weight`` reset to 1, what an engine runs when it does not
load the tensor). Tried on the overfit head: vLLM's tau stayed 4.000, because its trained norm
weights are within 0.06 of 1 (mean |w - 1| 0.012-0.016), so nothing changes that any check could
see; a head trained longer would move them.

The overlay's ``model.safetensors`` is a symlink to convert's draft: faults that change tensors
replace the link with a modified copy, so convert's head (which the oracle reads) stays intact.
"""

from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

FAULTS = ("aux-shift", "identity-d2t", "norm-layout")
KEY = "eagle_aux_hidden_state_layer_ids"


def _rewrite_tensors(overlay: Path, change) -> None:
    from safetensors.torch import load_file, save_file

    weights = overlay / "model.safetensors"
    tensors = load_file(str(weights.resolve()))
    change(tensors)
    weights.unlink()  # the symlink, not its target
    save_file(tensors, str(weights), metadata={"format": "pt"})


def inject(overlay: Path, fault: str) -> dict:
    """Break ``overlay`` in place with ``fault``; returns what was changed."""
    if fault == "aux-shift":
        config_path = overlay / "config.json"
        config = json.loads(config_path.read_text())
        right = list(config[KEY])
        config[KEY] = [i - 1 for i in right]
        config_path.write_text(json.dumps(config, indent=2))
        return {"aux_ids": {"right": right, "injected": config[KEY]}}
    if fault == "identity-d2t":
        import torch

        def zero(tensors):
            assert "d2t" in tensors, "the head has no d2t (draft vocab = target vocab): identity is then correct"
            tensors["d2t"] = torch.zeros_like(tensors["d2t"])

        _rewrite_tensors(overlay, zero)
        return {"d2t": "zeros"}
    if fault == "norm-layout":
        config_path = overlay / "config.json"
        config = json.loads(config_path.read_text())
        config["norm_before_residual"] = True
        config_path.write_text(json.dumps(config, indent=2))
        return {"norm_before_residual": True}
    if fault == "dropped-norm-scale":  # kept to show it: no behaviour change on a head with norm weights ~1
        import torch

        def drop(tensors):
            tensors["norm.weight"] = torch.ones_like(tensors["norm.weight"])

        _rewrite_tensors(overlay, drop)
        return {"norm.weight": "ones"}
    raise ValueError(fault)


@contextmanager
def injected(overlay: Path, fault: str) -> Iterator[dict]:
    """``inject`` for the duration of the block; the overlay is restored afterwards, also on failure."""
    backup = overlay.with_name(overlay.name + ".pristine")
    if backup.exists():
        shutil.rmtree(backup)
    shutil.copytree(overlay, backup, symlinks=True)
    try:
        yield inject(overlay, fault)
    finally:
        shutil.rmtree(overlay)
        backup.rename(overlay)
