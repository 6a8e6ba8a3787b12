"""The one safe renderer of launch scripts, shared by every engine's launch module.

Each word is ``shlex.quote``d, comment lines with control characters are escaped, environment
defaults are assigned on their own lines. Paths, model names and JSON arguments therefore reach
the program as one argument each, and nothing from a recipe or a path is ever run (issue 11,
item 5). A module of its own so that ``backends.launch`` and ``backends.vllm.launch`` both use it
without importing each other.
"""

from __future__ import annotations

import re
import shlex
import unicodedata
from typing import Any, Sequence


class Shell(str):
    """Text written into a script as is (not quoted): only constant fragments authored in the
    launch modules, such as ``"$HOST"`` or ``"$HERE/dataset.jsonl"``. Recipe values and paths never are."""


def env(name: str) -> Shell:
    """The double-quoted expansion of a variable the script sets (``"$HOST"``)."""
    return Shell(f'"${_env_name(name)}"')


_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")


def _env_name(name: str) -> str:
    if not _ENV_NAME.fullmatch(name):
        raise ValueError(f"not a shell variable name: {name!r}")
    return name


def shell_word(value: Any) -> str:
    """One argument as bash reads it back unchanged: ``Shell`` fragments as written, all else ``shlex.quote``d.

    ``shlex.quote`` single-quotes anything outside ``[A-Za-z0-9@%+=:,./_-]``, so ``$()``,
    backticks, quotes, globs and newlines stay data (a newline inside single quotes is
    part of the word, not the end of the command).
    """
    return str(value) if isinstance(value, Shell) else shlex.quote(str(value))


def comment_safe(text: str) -> str:
    """Text for a ``#`` comment line: control, format and separator characters escaped.

    A newline in a path would end the comment and run the rest as a command; CR, bidi
    overrides and other invisible characters could make a comment show other text
    than bash reads (Trojan Source). Letters of every script stay as they are.
    """
    out = []
    for ch in str(text):
        if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


def render_script(title: str, comments: Sequence[str], env_defaults: dict[str, Any],
                  argv: Sequence[Sequence[Any]]) -> str:
    """A bash launch script that ``exec``s one command; every engine's script goes through here.

    - ``title`` and ``comments`` become ``#`` lines (``comment_safe``);
    - ``env_defaults``: variables the user may override from the environment (``HOST=0.0.0.0
      serve.sh``). Each default is assigned on its own line, quoted unless it is a ``Shell``
      fragment, and never expanded inside ``${VAR:-...}`` where quoting would not apply;
    - ``argv``: the command, one group of words per script line; ``"$@"`` is appended so
      extra flags pass through. ``HERE`` (the script's folder) is set before anything else.
    """
    lines = ["#!/usr/bin/env bash", f"# {comment_safe(title)}"]
    lines += [f"# {comment_safe(line)}" if line else "#" for line in comments]
    # `--`: a bundle under a folder named like an option (-x) is still a folder.
    lines += ["set -euo pipefail", 'HERE="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"']
    for name, default in env_defaults.items():
        lines.append(f'if [[ -z "${{{_env_name(name)}:-}}" ]]; then {name}={shell_word(default)}; fi')
    groups = [list(group) for group in argv if list(group)]
    if not groups:
        raise ValueError("a launch script needs a command")
    groups[-1].append(Shell('"$@"'))
    words = [" ".join(shell_word(word) for word in group) for group in groups]
    lines.append("exec " + " \\\n  ".join(words))
    return "\n".join(lines) + "\n"
