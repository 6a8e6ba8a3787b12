"""Answers from transformers ``generate`` in this process (the target already loaded for training).

Prompts run longest first in left-padded batches of ``batch_size``; each finished batch's
answers are emitted (and so cached) before the next batch starts. With sampling, each batch
seeds torch from the sampling seed and its first prompt: a run from an empty cache is
reproducible; answers of a resumed sampling run depend on where it stopped.
"""

from __future__ import annotations

from typing import Any, Sequence

from . import AnswerSource, Emit, Key, Sampling, cut_at_stop


class InProcessSource(AnswerSource):
    name = "in-process generate"

    def __init__(self, model: Any, stop_ids: Sequence[int], pad_id: int, batch_size: int):
        self.model = model
        self.stop_ids = [int(s) for s in stop_ids]
        self.pad_id = int(pad_id)
        self.batch_size = int(batch_size)

    def identity(self) -> dict[str, Any]:
        """In-process answers depend on the dtype and device the target runs in (kernels differ)."""
        param = next(self.model.parameters())
        return {"engine": "inprocess", "dtype": str(param.dtype).replace("torch.", ""), "device": param.device.type}

    def score(self, prompt: list[int], answer: list[int]) -> list[tuple[float, int, float]]:
        """One teacher-forced forward over prompt + answer: per answer token (its logprob, best token, best logprob)."""
        import torch

        if not answer:
            return []
        device = next(self.model.parameters()).device
        ids = torch.tensor([list(prompt) + list(answer)], dtype=torch.long, device=device)
        with torch.no_grad():
            logits = self.model(input_ids=ids).logits[0, len(prompt) - 1: len(prompt) - 1 + len(answer)]
        logprobs = torch.log_softmax(logits.double(), dim=-1)
        best_lp, best = logprobs.max(dim=-1)
        chosen = logprobs.gather(1, torch.tensor(answer, device=device).unsqueeze(1)).squeeze(1)
        return [(float(c), int(b), float(m)) for c, b, m in zip(chosen.tolist(), best.tolist(), best_lp.tolist())]

    def answer(self, jobs: Sequence[tuple[Key, list[int]]], max_new_tokens: int, sampling: Sampling, emit: Emit) -> None:
        import torch

        order = sorted(jobs, key=lambda job: -len(job[1]))
        device = next(self.model.parameters()).device
        for start in range(0, len(order), self.batch_size):
            batch = order[start: start + self.batch_size]
            width = max(len(ids) for _, ids in batch)
            ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
            attn = torch.zeros((len(batch), width), dtype=torch.long)
            for row, (_, prompt) in enumerate(batch):
                ids[row, width - len(prompt):] = torch.tensor(prompt)
                attn[row, width - len(prompt):] = 1
            settings: dict[str, Any] = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
            if not sampling.greedy:
                torch.manual_seed(sampling.request_seed(batch[0][0]))
                settings = {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": None}
            with torch.no_grad():
                out = self.model.generate(
                    input_ids=ids.to(device),
                    attention_mask=attn.to(device),
                    max_new_tokens=max_new_tokens,
                    eos_token_id=sorted(set(self.stop_ids)) or None,
                    pad_token_id=self.pad_id,
                    **settings,
                )
            for row, (key, _) in enumerate(batch):
                emit(key, cut_at_stop(out[row, width:].tolist(), self.stop_ids, max_new_tokens))
