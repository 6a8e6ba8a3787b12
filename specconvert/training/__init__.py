"""Training a new EAGLE-3 head for a target (recipe block ``draft.train``).

- :mod:`.data`: training sequences (token ids + loss masks on the answers): prompts
  answered by the target itself (every turn of a conversation in order) plus
  teacher-forced text.
- :mod:`.answers`: where the answers come from (in-process ``generate``, the project's
  own vLLM, the user's URLs), with the cache, resume, probe and fingerprint they share.
- :mod:`.vocab`: draft-vocabulary calibration (``d2t``) from token frequencies.
- :mod:`.trainer`: the loop over Model Optimizer's EAGLE-3 training forward in its
  offline mode (target features computed here, once, and reused across epochs),
  with checkpoints, resume, a wall-clock budget and best-checkpoint selection.
- :mod:`.distributed` / :mod:`.sharded`: data parallelism under torchrun, optionally
  with the target's weights sharded over the processes (FSDP2) for targets larger
  than one device.
- :mod:`.evaluate`: acceptance of the trained head on held-out prompts, measured
  with the reference decoder.

Heavy imports (torch, transformers, modelopt) happen inside functions.
"""
