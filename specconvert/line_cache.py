"""Append-only JSONL caches that survive a kill: read back only the lines that were written whole.

A line is appended whole or, when the process is killed mid-write, cut. Reading stops at the
first cut or unreadable line; its byte offset tells the writer where to truncate before it
appends again (appending after a cut line would hide every later line from the next read).
Used by the synthesis cache (``training.answers``) and the self-written prompts
(``training.self_prompts``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator


def complete_rows(path: Path) -> Iterator[tuple[Any, int]]:
    """Each whole, parsable JSON line of ``path`` with the byte length of the file through it.

    Stops at the first line without a newline or that is not JSON; nothing when the file is missing.
    A consumer that rejects a row's content stops there too, keeping the length of the previous row.
    """
    path = Path(path)
    if not path.is_file():
        return
    data = path.read_bytes()
    end = 0
    while True:
        newline = data.find(b"\n", end)
        if newline < 0:
            return
        try:
            row = json.loads(data[end:newline].decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            return
        end = newline + 1
        yield row, end
