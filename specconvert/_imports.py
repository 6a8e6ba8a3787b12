"""Late imports of heavy dependencies.

torch, transformers, modelopt and tensorrt_llm are imported only inside the
functions that need them, through :func:`require`, so that ``specconvert --help``
and ``recipe validate`` stay fast and a missing package becomes a clear error.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import EnvironmentMissing

# module -> how to install it
_INSTALL_HINTS = {
    "torch": "pip install 'torch>=2.6' (CPU: pip install torch==2.13.0)",
    "transformers": "pip install 'transformers>=4.57,<5.15'",
    "modelopt": "pip install 'nvidia-modelopt>=0.37' requests",
    "tensorrt_llm": "install TensorRT-LLM on a GPU machine (see README, 'TensorRT-LLM'); "
    "or set runtime.backend: reference",
    "safetensors": "pip install safetensors",
    "gguf": "pip install gguf",
    "huggingface_hub": "pip install huggingface_hub",
    "matplotlib": "pip install matplotlib",
}


def require(module: str, purpose: str | None = None) -> ModuleType:
    """Import ``module`` or raise :class:`EnvironmentMissing` naming how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        what = f" (needed to {purpose})" if purpose else ""
        raise EnvironmentMissing(
            f"Python package '{top}' is not importable{what}: {exc}",
            fix=_INSTALL_HINTS.get(top, f"pip install {top}"),
        ) from exc


def installed_version(dist: str) -> str | None:
    """Version of an installed distribution, without importing it."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
