"""What keeps evaluation prompts out of training: a bounded overlap index and the held-out split.

Two texts overlap when they are equal after :func:`normalise` or share a run of
``OVERLAP_WORDS`` words. The index keeps a 64-bit hash (blake2b) of each whole text and of
each 8-word window, in one sorted ``uint64`` array: 8 bytes a window, where a Python set of
word tuples took a few hundred (GBs for 100k conversations). Two different windows share a
hash with odds of about n·m/2⁶⁴, far below one for any prompt set.

:func:`split_holdout` is the held-out split that picks the best checkpoint, with duplicate
prompts (ShareGPT dumps repeat first turns) kept on one side. Both are pure functions of their
inputs: no model, no files.
"""

from __future__ import annotations

import hashlib
import random
import string
import unicodedata
from typing import Any, Iterable, Iterator, Sequence

OVERLAP_WORDS = 8  # a shared run of this many words with a held-out prompt is a leak


def normalise(text: str) -> str:
    """Text folded for duplicate detection: case, whitespace and punctuation do not count."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    kept = "".join(" " if unicodedata.category(ch).startswith("P") or ch in string.punctuation else ch for ch in folded)
    return " ".join(kept.split())


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def _shingles(words: list[str]) -> Iterator[int]:
    """The whole text's hash (tagged so it cannot equal a window's), then each window's."""
    yield _hash("\x00" + " ".join(words))
    for i in range(len(words) - OVERLAP_WORDS + 1):
        yield _hash(" ".join(words[i: i + OVERLAP_WORDS]))


class OverlapIndex:
    """Held-out texts a training or written prompt must not overlap (equal after normalisation, or an 8-word run)."""

    def __init__(self, texts: Iterable[str]):
        import numpy as np

        hashes = np.fromiter((h for text in texts for h in _shingles(normalise(text).split())), dtype=np.uint64)
        self.hashes = np.unique(hashes)  # sorted, each once

    def __len__(self) -> int:
        return int(self.hashes.size)

    @property
    def nbytes(self) -> int:
        return int(self.hashes.nbytes)

    def overlaps(self, text: str) -> bool:
        import numpy as np

        if not self.hashes.size:
            return False
        probe = np.fromiter(_shingles(normalise(text).split()), dtype=np.uint64)
        where = np.searchsorted(self.hashes, probe).clip(max=self.hashes.size - 1)
        return bool((self.hashes[where] == probe).any())


def split_holdout(sequences: Sequence[Any], fraction: float, seed: int) -> tuple[list[Any], list[Any]]:
    """Training and held-out sequences, every prompt wholly on one side.

    A sequence has ``input_ids``, ``loss_mask`` and ``group`` (the prompt of one of several answers
    to it). Sequences are held out together when they share a group or their prompt: the tokens
    before the first trained one (the whole sequence for teacher-forced text). Without repeats this
    is the split it always was: the same seeded order, the same share.
    """
    if fraction <= 0 or len(sequences) < 4:
        return list(sequences), []
    order = list(range(len(sequences)))
    random.Random(seed).shuffle(order)
    n = max(1, int(round(fraction * len(sequences))))
    root = _prompt_groups(sequences)
    members: dict[int, list[int]] = {}
    for i in range(len(sequences)):
        members.setdefault(root[i], []).append(i)
    held: set[int] = set()
    for i in order:
        if len(held) >= n:
            break
        held.update(members[root[i]])
    if len(held) == len(sequences):
        return list(sequences), []
    return [s for i, s in enumerate(sequences) if i not in held], [sequences[i] for i in sorted(held)]


def prompt_key(sequence: Any) -> tuple[int, ...]:
    """The tokens before the first trained one (the prompt), or every token when all are trained."""
    mask = list(sequence.loss_mask)
    first = mask.index(1) if 1 in mask else len(mask)
    return tuple(sequence.input_ids[:first] if first else sequence.input_ids)


def _prompt_groups(sequences: Sequence[Any]) -> list[int]:
    """For each sequence, the smallest index of the sequences it must stay with (same group or same prompt)."""
    parent = list(range(len(sequences)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_of: dict[Any, int] = {}
    for i, s in enumerate(sequences):
        for key in (("prompt", prompt_key(s)), ("group", s.group) if s.group is not None else None):
            if key is None:
                continue
            j = first_of.setdefault(key, i)
            a, b = find(i), find(j)
            if a != b:
                parent[max(a, b)] = min(a, b)
    return [find(i) for i in range(len(sequences))]


def keep_out(samples: list[dict[str, Any]], held_out: OverlapIndex,
             texts_of: Any) -> tuple[list[dict[str, Any]], int]:
    """``samples`` without those whose user text overlaps ``held_out``, and how many were left out."""
    kept = [s for s in samples if not any(held_out.overlaps(t) for t in texts_of(s))]
    return kept, len(samples) - len(kept)
