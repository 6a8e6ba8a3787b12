"""Serving: the reference OpenAI-compatible server, an SSE-aware HTTP client, server process lifecycle.

- :mod:`.engine`  the reference decoder behind one worker thread, with per-request speculative metrics;
- :mod:`.app`     the FastAPI application (completions, chat, SSE, health, models, /perf_metrics);
- :mod:`.client`  an async httpx client that streams SSE and times every chunk (shared with bench);
- :mod:`.process` ``ServerProcess``: start a server in its own process group, wait for health, reap it.

Nothing here imports torch at import time; the engine loads the decoder when asked.
"""
