"""Which TensorRT-LLM version the bundle targets, and how that version spells EAGLE-3.

One table (``SPELLINGS``) maps a version line to its ``speculative_config``
spelling; the option names each line accepts live as data in
``specconvert/data/trtllm/options/<family>.json`` with their sources cited.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from ..._imports import installed_version
from ...errors import InputError


@dataclass(frozen=True)
class Spelling:
    """How one TensorRT-LLM version line configures EAGLE-3 on the PyTorch backend."""

    family: str  # also the options data file name
    first: tuple  # first version of the line (inclusive), parsed
    decoding_type: str
    model_key: str  # key naming the draft checkpoint
    config_class: str  # class in tensorrt_llm.llmapi that takes the speculative config
    fixed: dict[str, Any] = field(default_factory=dict)  # extra keys this line needs
    dynamic_tree: bool = False  # EAGLE-3 dynamic draft tree on the PyTorch backend
    greedy_only: bool = False  # EAGLE-3 verifies greedily only


# Oldest first. Sources: see the `source` field of each options data file.
SPELLINGS: tuple[Spelling, ...] = (
    # 1.2.x: `Eagle` + speculative_model_dir; one-model EAGLE-3 is opt-in by flag; greedy only;
    # one chain of max_draft_len draft tokens.
    Spelling("1.2", (1, 2, 0), "Eagle", "speculative_model_dir", "EagleDecodingConfig",
             fixed={"eagle3_one_model": True}, greedy_only=True),
    # 1.3.x: `Eagle3` + speculative_model (old spellings kept as aliases for a while; by
    # 1.3.0rc27 eagle3_one_model/greedy_sampling/posterior_threshold are gone).
    Spelling("1.3", (1, 3, 0), "Eagle3", "speculative_model", "Eagle3DecodingConfig"),
    # 1.4.x: eagle_choices dropped (rc1), num_eagle_layers dropped (rc4); the features page
    # documents a dynamic EAGLE-3 draft tree via use_dynamic_tree.
    Spelling("1.4", (1, 4, 0), "Eagle3", "speculative_model", "Eagle3DecodingConfig", dynamic_tree=True),
)
NEWEST_KNOWN = "1.4.0rc4"

_VERSION_RE = re.compile(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?(?:\.?(rc|a|b|dev|post)\.?(\d+))?")


def parse_version(text: str) -> tuple:
    """``1.3.0rc27`` -> (1, 3, 0); enough to order version lines (see :func:`parse_release` for rcs)."""
    match = _VERSION_RE.match(str(text))
    if not match:
        raise InputError(
            f"runtime.trtllm_version: '{text}' is not a version", fix="write e.g. `1.2`, `1.3.0rc27` or `auto`"
        )
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


# Pre-release order of one version (PEP 440): 1.3.0.dev1 < 1.3.0a1 < 1.3.0b1 < 1.3.0rc1 < 1.3.0 < 1.3.0.post1.
_STAGE_RANK = {"dev": 0, "a": 1, "b": 2, "rc": 3, None: 4, "post": 5}


def parse_release(text: str) -> tuple:
    """``1.3.0rc27`` -> (1, 3, 0, 3, 27): orders release candidates within a line.

    A version without a pre-release part (``1.3``, ``1.3.0``) is the final release, which
    comes after every one of its release candidates: pinning ``1.3`` means "the 1.3 release".
    """
    match = _VERSION_RE.match(str(text))
    if not match:
        parse_version(text)  # raises the one-line InputError
    stage = match.group(4)
    return (*parse_version(text), _STAGE_RANK[stage], int(match.group(5) or 0))


def in_release_window(version: str, first: str | None = None, last: str | None = None) -> bool:
    """``first <= version <= last`` at release-candidate granularity (None = open end)."""
    release = parse_release(version)
    if first is not None and release < parse_release(first):
        return False
    return last is None or release <= parse_release(last)


@dataclass(frozen=True)
class TargetVersion:
    version: str
    source: str  # installed | recipe | newest-known
    spelling: Spelling
    warnings: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "trtllm_version": self.version,
            "trtllm_version_source": self.source,
            "spelling_family": self.spelling.family,
            "decoding_type": self.spelling.decoding_type,
            "draft_model_key": self.spelling.model_key,
            "speculative_config_class": self.spelling.config_class,
            # where a running trtllm-serve of this release serves acceptance (data/trtllm/acceptance_sources.json)
            "trtllm_acceptance_line": _acceptance_line(self.version),
        }


def _acceptance_line(version: str) -> str:
    return line_for(version)["line"]


# Where each release line serves acceptance (``data/trtllm/acceptance_sources.json``, sources cited there): data
# keyed by release window like the spellings, read by ``acceptance.AcceptanceReader``.
@lru_cache(maxsize=None)
def sources_table() -> dict[str, Any]:
    path = resources.files("specconvert") / "data" / "trtllm" / "acceptance_sources.json"
    return json.loads(path.read_text(encoding="utf-8"))


def line_for(version: str) -> dict[str, Any]:
    """The table row of the version line ``version`` (``1.3.0rc20`` -> ``1.3-early``)."""
    lines = sources_table()["lines"]
    for row in lines:
        before = row["before"]
        if in_release_window(version, row["first"]) and (before is None or not in_release_window(version, before)):
            return row
    return lines[0]  # older than every line: versions.spelling_for refuses those before anything is read


def spelling_for(version: str) -> tuple[Spelling, list[str]]:
    parsed = parse_version(version)
    if parsed < SPELLINGS[0].first:
        raise InputError(
            f"TensorRT-LLM {version} is older than the oldest supported line (1.2)",
            fix="use TensorRT-LLM >= 1.2 (runtime.trtllm_version: 1.2 or newer)",
        )
    chosen = SPELLINGS[0]
    for spelling in SPELLINGS:
        if parsed >= spelling.first:
            chosen = spelling
    warnings = []
    if parsed[:2] > chosen.first[:2]:
        warnings.append(
            f"TensorRT-LLM {version} is newer than the newest line specconvert knows ({chosen.family}); "
            f"using the {chosen.family} spellings — check the bundle's options against that version"
        )
    return chosen, warnings


def resolve(pinned: str = "auto", installed: str | None = None, detect: bool = True) -> TargetVersion:
    """The version the bundle targets: installed > recipe pin > newest known (with a warning).

    An installed TensorRT-LLM that differs from a pinned version wins (the bundle
    must load here) and the mismatch is reported as a warning.
    """
    if detect and installed is None:
        installed = installed_version("tensorrt_llm")
    warnings: list[str] = []
    if installed:
        version, source = installed, "installed"
        # Option names differ between release candidates of one line (options data `releases`), so a
        # pin that names another release than the installed one is worth a warning too.
        if pinned != "auto" and parse_release(pinned) != parse_release(installed):
            warnings.append(
                f"runtime.trtllm_version is {pinned} but TensorRT-LLM {installed} is installed; "
                f"the bundle uses {installed}'s spellings"
            )
    elif pinned != "auto":
        version, source = pinned, "recipe"
    else:
        version, source = NEWEST_KNOWN, "newest-known"
        warnings.append(
            f"tensorrt_llm is not installed and runtime.trtllm_version is auto: the bundle uses the spellings "
            f"of the newest known version ({NEWEST_KNOWN}); pin runtime.trtllm_version to the version you deploy"
        )
    spelling, more = spelling_for(version)
    return TargetVersion(version, source, spelling, tuple(warnings + more))
