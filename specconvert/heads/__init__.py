"""Third-party EAGLE-3 heads: read any common layout, validate against the target, map to the canonical layout.

Public API (torch is imported only when a function that needs it runs)::

    ckpt = read_head(path, format="auto", allow_pickle=False)
    head = to_canonical(ckpt)
    problems = check_against_target(head, TargetInfo.from_config(target_config))
    aux_ids, note = resolve_aux_layers("auto", "output", head.arch.aux_layer_ids, head.arch.n_aux, N)
"""

from .checks import (
    Problem,
    TargetInfo,
    check_against_target,
    check_head,
    default_aux_layer_ids,
    errors_of,
    raise_for_problems,
    resolve_aux_layers,
)
from .describe import describe_head, describe_target
from .layouts import CanonicalHead, HeadArch, to_canonical
from .reading import HeadCheckpoint, check_safetensors_file, read_head

__all__ = [
    "CanonicalHead", "HeadArch", "HeadCheckpoint", "Problem", "TargetInfo",
    "check_against_target", "check_head", "check_safetensors_file", "default_aux_layer_ids",
    "describe_head", "describe_target", "errors_of", "raise_for_problems", "read_head",
    "resolve_aux_layers", "to_canonical",
]
