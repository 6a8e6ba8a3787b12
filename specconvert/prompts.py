"""Prompt and text sets: ``builtin:NAME`` (shipped under ``specconvert/data/prompts``) or a file.

A file is JSONL (one object per line with ``text``, ``prompt`` or ``messages``) or plain
text (one sample per blank-line-separated paragraph).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import InputError

_BUILTIN_DIR = Path(__file__).parent / "data" / "prompts"


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


def source_path(spec: str, key: str, base_dir: Path) -> Path | None:
    """The file behind a sample-set spec (None for ``python:docs``, which is not a file)."""
    if spec == PYTHON_DOCS:
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
    """Samples as dicts with one of ``text`` / ``prompt`` / ``messages``."""
    path = source_path(spec, key, base_dir)
    if path is None:
        return _python_docs()
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{key}: {path} is not UTF-8 text (byte {exc.start})", fix="save the file as UTF-8") from None
    if path.suffix == ".jsonl":
        samples = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{key}: {path}:{number} is not valid JSON ({exc.msg})", fix="one JSON object per line") from None
            if not isinstance(item, dict) or not ({"text", "prompt", "messages"} & set(item)):
                raise InputError(f"{key}: {path}:{number} needs a 'text', 'prompt' or 'messages' field", fix='e.g. {"prompt": "..."}')
            problem = _messages_problem(item.get("messages")) if "messages" in item else None
            if problem:
                raise InputError(f"{key}: {path}:{number}: 'messages' {problem}",
                                 fix='write a list of {"role": ..., "content": "..."} objects, or use "prompt" for plain text')
            samples.append(item)
    else:
        samples = [{"text": block.strip()} for block in text.split("\n\n") if block.strip()]
    if not samples:
        raise InputError(f"{key}: {path} holds no samples", fix="add at least one line")
    return samples


def _messages_problem(messages: Any) -> str | None:
    """Why ``messages`` is not a chat (None when it is): caught while reading, not after a model loads."""
    if not isinstance(messages, list):
        return f"is a {type(messages).__name__}, not a list of messages"
    for n, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"item {n} is a {type(message).__name__}, not an object with role and content"
        content = message.get("content", "")
        parts_ok = isinstance(content, list) and all(isinstance(part, dict) for part in content)  # OpenAI content parts
        if not isinstance(message.get("role", "user"), str) or not (isinstance(content, str) or parts_ok):
            return f"item {n} needs a string 'role' and a string 'content'"
    return None


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
