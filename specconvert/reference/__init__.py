"""Reference EAGLE-3 speculative decoder in plain PyTorch over a transformers target.

Public API::

    from specconvert.reference import ReferenceDecoder, DecodeSettings
    dec = ReferenceDecoder.from_dirs(target_dir, draft_dir, aux_layer_ids, device="cpu", dtype="float32")
    res = dec.generate(prompt_ids, max_new_tokens, DecodeSettings(max_draft_len=3))

Importing this package imports torch; command modules import it inside functions.
"""

from .decoder import DecodeSettings, GenerateResult, ReferenceDecoder, Step, summarise
from .draft_head import DraftHead
from .target import TargetModel
from .tree import DraftTree, TreeShape

__all__ = [
    "DecodeSettings",
    "DraftHead",
    "DraftTree",
    "GenerateResult",
    "ReferenceDecoder",
    "Step",
    "TargetModel",
    "TreeShape",
    "summarise",
]
