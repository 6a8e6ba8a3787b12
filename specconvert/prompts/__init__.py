"""Prompt and text sets: ``builtin:NAME`` (shipped under ``specconvert/data/prompts``), ``python:docs`` or a file.

A file is JSONL (one object per line), a JSON array of the same objects (``.json``, how
the ShareGPT dumps ship), or plain text (one sample per blank-line-separated paragraph).
Each object is read by the reader of its format (:mod:`.formats`: OpenAI ``messages``,
ShareGPT ``conversations``, ``prompt``, ``text``). ``self:N`` (prompts the target writes,
``draft.train.prompts`` only) is parsed here and generated in ``training/self_prompts.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import InputError
from .formats import RowError, json_type, read_row

_BUILTIN_DIR = Path(__file__).parent.parent / "data" / "prompts"
SELF_PREFIX = "self:"


def builtin_names() -> list[str]:
    return sorted(p.stem for p in _BUILTIN_DIR.glob("*.jsonl"))


PYTHON_DOCS = "python:docs"


def _python_docs() -> list[dict[str, Any]]:
    """The Python documentation topics every CPython ships (``pydoc_data``): English prose and code, offline."""
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip pydoc_data
        raise InputError(f"{PYTHON_DOCS}: this Python has no pydoc_data module", fix="use a text file instead") from None
    return [{"text": topics[name]} for name in sorted(topics)]


def self_count(spec: str, key: str) -> int | None:
    """N of a ``self:N`` spec (None for any other spec); ``self:0`` or ``self:x`` is bad input."""
    if not spec.startswith(SELF_PREFIX):
        return None
    value = spec[len(SELF_PREFIX):].strip()
    if not value.isdigit() or int(value) < 1:
        raise InputError(f"{key}: '{spec}' needs a whole number of prompts of at least 1",
                         fix="write self:N, e.g. self:2000, or remove it")
    return int(value)


def source_path(spec: str, key: str, base_dir: Path) -> Path | None:
    """The file behind a sample-set spec (None for ``python:docs`` and ``self:N``, which are not files)."""
    if spec == PYTHON_DOCS:
        return None
    if self_count(spec, key) is not None:
        return None
    if spec.startswith("builtin:"):
        name = spec.split(":", 1)[1]
        path = (_BUILTIN_DIR / f"{name}.jsonl").resolve()
        # a name, not a path: builtin:../../x must not reach outside the shipped sets
        if name not in builtin_names() or not path.is_relative_to(_BUILTIN_DIR.resolve()) or not path.is_file():
            raise InputError(f"{key}: no built-in set '{name}'", fix=f"use one of: {', '.join('builtin:' + n for n in builtin_names())}")
        return path
    path = Path(spec).expanduser()
    path = path if path.is_absolute() else (base_dir / path)
    if not path.is_file():
        raise InputError(f"{key}: file '{path}' does not exist", fix="give a JSONL file or builtin:NAME")
    return path


def load_samples(spec: str, key: str, base_dir: Path) -> list[dict[str, Any]]:
    """Samples as dicts with one of ``text`` / ``prompt`` / ``messages`` (and the row's ``id``).

    Every row is read before anything else happens: a bad one stops the run here, naming
    the file and line, so no cache is ever started from a half-read file.
    """
    if self_count(spec, key) is not None:
        raise InputError(f"{key}: '{spec}' (prompts the target writes) is only read by draft.train.prompts",
                         fix="give builtin:NAME or a file here")
    path = source_path(spec, key, base_dir)
    if path is None:
        return _python_docs()
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{key}: {path} is not UTF-8 text (byte {exc.start})", fix="save the file as UTF-8") from None
    if path.suffix == ".jsonl":
        samples = []
        # "\n" only: str.splitlines() also splits on U+2028/U+2029/U+0085, which JSON strings hold raw
        for number, line in enumerate(text.split("\n"), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{key}: {path}:{number} is not valid JSON ({exc.msg})", fix="one JSON object per line") from None
            samples.append(_read(item, key, f"{path}:{number}"))
    elif path.suffix == ".json":
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{key}: {path}:{exc.lineno} is not valid JSON ({exc.msg})",
                             fix="a JSON array of objects (or JSONL: one object per line)") from None
        if not isinstance(items, list):
            raise InputError(f"{key}: {path} holds a JSON {json_type(items)}, not an array of samples",
                             fix="a JSON array of objects (or JSONL: one object per line)")
        samples = [_read(item, key, f"{path} item {n}") for n, item in enumerate(items)]
    else:
        samples = [{"text": block.strip()} for block in text.split("\n\n") if block.strip()]
    if not samples:
        raise InputError(f"{key}: {path} holds no samples", fix="add at least one line")
    return samples


def _read(item: Any, key: str, where: str) -> dict[str, Any]:
    try:
        return read_row(item)
    except RowError as exc:
        raise InputError(f"{key}: {where}: {exc.problem}", fix=exc.fix) from None


def sample_text(sample: dict[str, Any], tokenizer: Any = None) -> str:
    """Plain text of a sample (chat messages rendered with the tokenizer's template when it has one)."""
    if "text" in sample:
        return str(sample["text"])
    if "prompt" in sample:
        return str(sample["prompt"])
    messages = sample["messages"]
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False)
    return "\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in messages)
