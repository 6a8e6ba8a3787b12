"""TensorRT-LLM backend: version spellings, option names as data, the options
writer, the EAGLE-3 combination rules and a thin loader over ``tensorrt_llm.LLM``.

Nothing here imports ``tensorrt_llm`` at module import time.
"""
