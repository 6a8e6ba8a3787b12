"""Tiny real targets (random weights + a byte-level tokenizer) saved as Hugging Face folders."""

from __future__ import annotations

from pathlib import Path


def byte_tokenizer():
    """A 256-token byte-level tokenizer (every byte one token), with a tiny chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=sorted(alphabet)[0], pad_token=sorted(alphabet)[0])
    return fast


def write_tiny_target(directory: Path, seed: int = 0, logit_scale: float = 1.0, **overrides) -> Path:
    """Save a seeded tiny Llama (sizes of tests.helpers.heads.TINY) with its tokenizer.

    ``logit_scale`` multiplies the lm_head: a random model's next-token distribution is
    nearly flat, a scaled one is peaked like a trained model's (what a draft head learns).
    """
    import torch
    from transformers import LlamaForCausalLM

    from tests.helpers.heads import target_config

    torch.manual_seed(seed)
    config = target_config(**overrides)
    model = LlamaForCausalLM(config)
    if logit_scale != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(logit_scale)
    model.config.architectures = ["LlamaForCausalLM"]
    model.save_pretrained(directory, safe_serialization=True)
    byte_tokenizer().save_pretrained(directory)
    return Path(directory)
