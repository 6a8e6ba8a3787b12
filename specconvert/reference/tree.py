"""Draft trees and the drafters that grow them.

A :class:`DraftTree` holds ``T`` draft nodes in verify order (parents before
children, shallow before deep). In the verify block, index 0 is the root (the last
emitted token, not yet seen by the target) and node ``i`` sits at index ``i + 1``.

:class:`EagleDrafter` grows the EAGLE-2/3 dynamic tree: per depth it expands the
``top_k`` best frontier nodes by cumulative log-prob, pools every candidate, and
finally keeps the best ``total_tokens - 1`` (a stable sort puts a parent before a
child of equal score, so the kept set is closed under ancestors: a connected tree).
A chain (TensorRT-LLM's linear EAGLE-3) is the same code with ``top_k = 1`` and
``depth = max_draft_len``. All work is batched per depth; nothing loops over nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .draft_head import DraftHead, DraftKVCache


@dataclass
class TreeShape:
    top_k: int
    depth: int
    total_tokens: int

    @classmethod
    def chain(cls, max_draft_len: int) -> "TreeShape":
        return cls(top_k=1, depth=max_draft_len, total_tokens=max_draft_len + 1)

    def capped(self, depth: int) -> "TreeShape":
        depth = max(0, min(self.depth, depth))
        return TreeShape(self.top_k, depth, min(self.total_tokens, 1 + self.top_k + max(0, depth - 1) * self.top_k**2))


@dataclass
class DraftTree:
    tokens: torch.Tensor  # [T] target token ids (CPU, long)
    parents: torch.Tensor  # [T] node index of the parent, -1 = root (CPU, long)
    depths: torch.Tensor  # [T] 1-based depth (CPU, long)
    levels: list[torch.Tensor] = field(default_factory=list)  # node indices per depth
    ancestors: torch.Tensor = None  # [T+1, T+1] bool, verify-block ancestor-or-self mask

    @property
    def size(self) -> int:
        return int(self.tokens.numel())

    @classmethod
    def build(cls, tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor) -> "DraftTree":
        tokens, parents, depths = tokens.cpu().long(), parents.cpu().long(), depths.cpu().long()
        n = tokens.numel()
        max_depth = int(depths.max()) if n else 0
        levels = [(depths == d).nonzero().flatten() for d in range(1, max_depth + 1)]
        anc = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        anc[0, 0] = True
        for level in levels:  # one vectorised row-copy per depth
            rows = level + 1
            anc[rows] = anc[parents[level] + 1]
            anc[rows, rows] = True
        return cls(tokens=tokens, parents=parents, depths=depths, levels=levels, ancestors=anc)

    @classmethod
    def empty(cls) -> "DraftTree":
        z = torch.zeros(0, dtype=torch.long)
        return cls.build(z, z, z)

    def children_lists(self) -> list[list[int]]:
        """Verify-block children of each verify-block index, in draft-score order."""
        out: list[list[int]] = [[] for _ in range(self.size + 1)]
        for node, parent in enumerate(self.parents.tolist()):
            out[parent + 1].append(node + 1)
        return out

    def paths(self) -> list[list[int]]:
        """Every root-to-leaf path as verify-block indices (tests and debugging)."""
        leaves = set(range(1, self.size + 1)) - {p + 1 for p in self.parents.tolist() if p >= 0}
        return [self.ancestors[leaf].nonzero().flatten().tolist() for leaf in sorted(leaves)] or [[0]]


class EagleDrafter:
    """Drafts with an EAGLE-3 head; keeps the head's KV cache in step with the target's."""

    def __init__(self, head: DraftHead, embed):
        self.head = head
        self.embed = embed  # target token ids -> target embeddings
        self.cache: DraftKVCache | None = None
        self.committed = 0  # draft cache entries backed by target features
        self._last_hidden: torch.Tensor | None = None

    def reset(self) -> None:
        if self.cache is None:
            self.cache = self.head.new_cache()
        self.cache.crop(0)
        self.committed = 0
        self._last_hidden = None

    @torch.inference_mode()
    def commit(self, aux: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Encode target features paired with the tokens that follow them.

        ``aux`` ``[m, 3H]``: target features at positions ``c .. c+m-1`` (c = committed
        length); ``next_tokens`` ``[m]``: the token after each of those positions.
        Drops any draft-tree entries left from the previous step first.
        """
        head = self.head
        dev = head.fc.weight.device
        start = self.committed
        self.cache.crop(start)
        m = next_tokens.numel()
        hidden = head.fc(aux.to(dev, head.fc.weight.dtype)).view(1, m, -1)
        embeds = self.embed(next_tokens.to(dev)).view(1, m, -1)
        positions = torch.arange(start, start + m, device=dev)
        out = head(hidden, embeds, positions, self.cache)
        self._last_hidden = out[:, -1:]
        self.committed = start + m

    @torch.inference_mode()
    def draft(self, shape: TreeShape) -> DraftTree:
        """Grow a dynamic tree (or a chain) from the last committed hidden state."""
        if shape.depth < 1 or shape.total_tokens < 2:
            return DraftTree.empty()
        head = self.head
        dev = head.fc.weight.device
        base = self.committed  # position of the first draft token's input
        k = min(shape.top_k, head.cfg.draft_vocab_size)
        logp = torch.log_softmax(head.draft_logits(self._last_hidden)[0, -1].float(), dim=-1)
        scores, draft_ids = logp.topk(k)
        pool_scores, pool_ids, pool_parents, pool_depths = [scores], [draft_ids], [torch.full((k,), -1, device=dev)], [1]
        frontier_ids, frontier_scores = draft_ids, scores
        frontier_hidden = self._last_hidden.expand(1, k, -1)
        frontier_pool = torch.arange(k, device=dev)
        frontier_anc = torch.zeros(k, 0, dtype=torch.bool, device=dev)
        eye = torch.eye(k, dtype=torch.bool, device=dev)
        offset = k
        for level in range(1, shape.depth):
            embeds = self.embed(head.to_target_ids(frontier_ids)).view(1, k, -1)
            positions = torch.full((k,), base + level - 1, device=dev)
            mask = torch.cat((torch.ones(k, base, dtype=torch.bool, device=dev), frontier_anc, eye), dim=1)
            out = head(frontier_hidden, embeds, positions, self.cache, mask)  # [1, k, H]
            logp = torch.log_softmax(head.draft_logits(out)[0].float(), dim=-1)  # [k, Vd]
            child_scores, child_ids = logp.topk(k, dim=-1)
            cum = (frontier_scores[:, None] + child_scores).flatten()
            child_ids = child_ids.flatten()
            pool_scores.append(cum)
            pool_ids.append(child_ids)
            pool_parents.append(frontier_pool.repeat_interleave(k))
            pool_depths.append(level + 1)
            best = cum.topk(k).indices
            parent_row = best // k
            frontier_ids, frontier_scores = child_ids[best], cum[best]
            frontier_hidden = out[:, parent_row]
            frontier_pool = offset + best
            frontier_anc = torch.cat((frontier_anc[parent_row], eye[parent_row]), dim=1)
            offset += k * k
        scores = torch.cat(pool_scores)
        ids = torch.cat(pool_ids)
        parents = torch.cat(pool_parents)
        depths = torch.cat([torch.full((s.numel(),), d, device=dev) for s, d in zip(pool_scores, pool_depths)])
        n = min(shape.total_tokens - 1, scores.numel())
        keep = torch.sort(scores, descending=True, stable=True).indices[:n].sort().values
        remap = torch.full((scores.numel(),), -1, dtype=torch.long, device=dev)
        remap[keep] = torch.arange(n, device=dev)
        kept_parents = parents[keep]
        node_parents = torch.where(kept_parents >= 0, remap[kept_parents.clamp(min=0)], kept_parents)
        return DraftTree.build(head.to_target_ids(ids[keep]), node_parents, depths[keep])


class OracleDrafter:
    """Proposes the target's own greedy continuation (known in advance).

    The tree's main path is the true continuation; for ``top_k > 1`` each true node
    also gets ``top_k - 1`` wrong siblings, and the true child is placed at a
    different sibling slot each step so that verification cannot rely on order.
    """

    def __init__(self, vocab_size: int, corrupt_every: int = 0):
        self.vocab_size = vocab_size
        # Tests: replace the true token at (step + depth) % corrupt_every == 0, to get partial acceptance.
        self.corrupt_every = corrupt_every
        self.sequence: list[int] = []
        self._step = 0

    def reset(self, sequence: list[int]) -> None:
        self.sequence = list(sequence)
        self._step = 0

    def draft(self, shape: TreeShape, position: int) -> DraftTree:
        """``position``: index in the full sequence of the root token."""
        truth = self.sequence[position + 1 : position + 1 + shape.depth]
        if not truth or shape.total_tokens < 2:
            return DraftTree.empty()
        spare = max(0, shape.total_tokens - 1 - len(truth))  # budget for wrong siblings
        truth = truth[: shape.total_tokens - 1]
        tokens, parents, depths = [], [], []
        parent = -1
        self._step += 1
        for d, tok in enumerate(truth, start=1):
            if self.corrupt_every and (self._step + d) % self.corrupt_every == 0:
                tok = (tok + self.vocab_size // 2) % self.vocab_size
            n_wrong = min(max(0, shape.top_k - 1), spare)
            spare -= n_wrong
            slot = (self._step + d) % (n_wrong + 1)
            for j in range(n_wrong + 1):
                if j == slot:
                    true_index = len(tokens)
                    tokens.append(tok)
                else:
                    tokens.append((tok + 1 + j) % self.vocab_size)
                parents.append(parent)
                depths.append(d)
            parent = true_index
        return DraftTree.build(torch.tensor(tokens), torch.tensor(parents), torch.tensor(depths))
