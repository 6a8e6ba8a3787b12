"""Prompt lookup (n-gram speculation) replayed on a greedy output: what an engine's n-gram proposer drafts at each
step, and how much of it the target accepts. The oracle for a bundle that serves n-gram (tune's choice), with no
model to load.

The proposer is vLLM 0.32's (``vllm/v1/spec_decode/ngram_proposer.py``,
``_find_longest_matched_ngram_and_propose_tokens``), restated here as a plain search rather than its KMP scan:
over the request's tokens so far (prompt + output), take the longest suffix of ``prompt_lookup_min`` to
``prompt_lookup_max`` tokens that also occurs earlier (an occurrence ending before the last token; where several
are equally long, the earliest), and draft the up to ``k`` tokens that follow it (fewer where the tokens run out,
none past ``max_model_len``). It runs after every step, the prefill's included. A step with no match drafts
nothing, and vLLM's counters do not count it (``Scheduler._make_spec_decoding_stats`` returns early).

Greedy verification accepts a draft's tokens while they equal the greedy continuation, so acceptance is a pure
function of (prompt ids, greedy output ids, the lookup window, k). The replay sees only the output the engine
returned: a last step whose accepted drafts ran past ``max_tokens`` or the end-of-turn token counts them in the
engine's counters but not here (at most ``k`` tokens per request).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

SOURCE = "n-gram proposer replayed on the greedy output (vLLM 0.32 ngram_proposer.py)"


def propose(tokens: Sequence[int], min_n: int, max_n: int, k: int, max_model_len: int | None = None) -> list[int]:
    """The draft prompt lookup makes after ``tokens``: up to ``k`` tokens following the earliest earlier occurrence
    of the longest matching suffix (``min_n``..``max_n`` tokens long); empty without a match."""
    tokens = list(tokens)
    total = len(tokens)
    if total < min_n:
        return []
    if max_model_len is not None:
        k = min(k, max_model_len - total)
    if k <= 0:
        return []
    for n in range(min(max_n, total - 1), max(min_n, 1) - 1, -1):
        suffix = tokens[total - n:]
        for start in range(total - n):  # occurrences that end before the last token
            if tokens[start:start + n] == suffix:
                follow = start + n
                return tokens[follow:follow + min(k, total - follow)]
    return []


@dataclass
class Replay:
    """What prompt lookup drafted and the target accepted over some requests (vLLM's counters' terms)."""

    k: int
    drafts: int = 0  # steps that drafted (a step without a match is not counted)
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    steps: int = 0  # every decode step after the prefill, drafting or not
    tokens: int = 0  # output tokens those steps made (the prefill's excluded)
    requests: int = 0

    def __post_init__(self) -> None:
        if not self.accepted_per_position:
            self.accepted_per_position = [0] * self.k

    def add(self, prompt_ids: Sequence[int], output_ids: Sequence[int], min_n: int, max_n: int,
            max_model_len: int | None = None) -> None:
        """Replay one request: its prompt and the greedy output the engine returned."""
        context, out = list(prompt_ids), list(output_ids)
        self.requests += 1
        self.tokens += max(len(out) - 1, 0)
        i = 1  # the prefill made out[0]; the proposer runs after it and after every step since
        while i < len(out):
            draft = propose(context + out[:i], min_n, max_n, self.k, max_model_len)
            accepted = 0
            if draft:
                self.drafts += 1
                self.draft_tokens += len(draft)
                while accepted < len(draft) and i + accepted < len(out) and draft[accepted] == out[i + accepted]:
                    self.accepted_per_position[accepted] += 1
                    accepted += 1
                self.accepted += accepted
            self.steps += 1
            i += accepted + 1

    @property
    def acceptance_length(self) -> float | None:
        """Tokens per drafting step (vLLM's counters' tau: 1 + accepted / drafts)."""
        return 1 + self.accepted / self.drafts if self.drafts else None

    @property
    def tokens_per_step(self) -> float | None:
        """Tokens per decode step over every step, drafting or not."""
        return self.tokens / self.steps if self.steps else None

    def acceptance(self):
        """As an :class:`~specconvert.acceptance.Acceptance` (``measured`` by replay, the oracle's reference)."""
        from ..acceptance import from_counts

        return from_counts(SOURCE, drafts=self.drafts, draft_tokens=self.draft_tokens, accepted_tokens=self.accepted,
                           accepted_per_position=list(self.accepted_per_position), requests=self.requests)
