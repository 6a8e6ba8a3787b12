"""Fixtures for the reference decoder: a tiny target + a Model Optimizer EAGLE-3 head.

The pair is built once per session: a seeded 8-layer Llama (hidden 64, vocab 256,
so Model Optimizer's default aux layers {1, N//2-1, N-4} = [1, 3, 4] are distinct),
converted with ``mtsp.convert`` and exported with ``export_speculative_decoding``
into the canonical draft layout, with a reduced draft vocab (128) and a random d2t.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

AUX = [1, 3, 4]
MAX_POS = 96
VOCAB = 256
DRAFT_VOCAB = 128
EOS = 2


def char_tokenizer():
    """A 256-token character-level tokenizer; ids 0-2 are <unk>, <s>, </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)] + [chr(c) for c in range(161, 161 + VOCAB - 3 - 95)]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{ch: i + 3 for i, ch in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


@dataclass
class TinyPair:
    target_dir: Path
    draft_dir: Path
    modelopt_model: object  # the converted HF model with .eagle_module (perturbed norms, random d2t)


def make_pair(root: Path, seed: int = 0) -> TinyPair:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    import modelopt.torch.speculative as mtsp
    from modelopt.torch.export.unified_export_hf import export_speculative_decoding
    from modelopt.torch.speculative.config import EAGLE3_DEFAULT_CFG

    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=VOCAB, max_position_embeddings=MAX_POS, tie_word_embeddings=False,
        initializer_range=0.1, bos_token_id=1, eos_token_id=EOS,
    )
    model = LlamaForCausalLM(config).eval()
    model.config.architectures = ["LlamaForCausalLM"]
    target_dir, draft_dir = root / "target", root / "draft"
    model.save_pretrained(target_dir)
    char_tokenizer().save_pretrained(target_dir)
    GenerationConfig(bos_token_id=1, eos_token_id=[EOS]).save_pretrained(target_dir)

    cfg = copy.deepcopy(EAGLE3_DEFAULT_CFG)["config"]
    cfg["eagle_use_torch_compile"] = False
    cfg["eagle_export_rope_scaling"] = {}
    cfg["eagle_architecture_config"].update(
        intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16, draft_vocab_size=DRAFT_VOCAB
    )
    mtsp.convert(model, [("eagle", cfg)])
    assert list(model.eagle_config.eagle_aux_hidden_state_layer_ids) == AUX
    eagle = model.eagle_module
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        # Non-trivial norms and a real vocab mapping, so a wrong order of operations shows.
        for norm in (eagle.layers[0].input_layernorm, eagle.layers[0].hidden_norm,
                     eagle.layers[0].post_attention_layernorm, eagle.norm):
            norm.weight.copy_(1 + 0.5 * torch.randn(norm.weight.shape, generator=gen))
        for lin in (eagle.fc, eagle.lm_head, *[m for m in eagle.layers[0].modules() if isinstance(m, torch.nn.Linear)]):
            lin.weight.mul_(3.0)
        used = torch.randperm(VOCAB, generator=gen)[:DRAFT_VOCAB].sort().values
        eagle.d2t.copy_(used - torch.arange(DRAFT_VOCAB))
    export_speculative_decoding(model, export_dir=str(draft_dir))
    return TinyPair(target_dir, draft_dir, model.eval())


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    """Tiny models are all per-op overhead: extra intra-op threads only contend (10x slower on 2 busy cores)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def pair(tmp_path_factory) -> TinyPair:
    return make_pair(tmp_path_factory.mktemp("pair"))


@pytest.fixture(scope="session")
def eagle_dec(pair):
    from specconvert.reference import ReferenceDecoder

    return ReferenceDecoder.from_dirs(pair.target_dir, pair.draft_dir, AUX, device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def modelopt_dec(pair):
    """The same head in Model Optimizer's HF-module norm layout (drafts exactly like ModelOpt)."""
    from specconvert.reference import ReferenceDecoder

    return ReferenceDecoder.from_dirs(pair.target_dir, pair.draft_dir, AUX, dtype="float32", norm_layout="modelopt-hf")


@pytest.fixture(scope="session")
def oracle_dec(pair):
    from specconvert.reference import ReferenceDecoder

    return ReferenceDecoder.from_dirs(pair.target_dir, None, None, dtype="float32", drafter="oracle")


def hf_greedy(model, prompt: list[int], max_new: int, eos=EOS) -> list[int]:
    import torch

    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_new, eos_token_id=eos,
                         pad_token_id=0, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


def write_workdir(root: Path, pair: TinyPair, **recipe_extra) -> Path:
    """A recipe + hand-written convert manifest pointing at the tiny pair; returns the recipe path."""
    import yaml

    workdir = root / "run"
    (workdir / "convert").mkdir(parents=True)
    manifest = {
        "manifest_version": 1,
        "stage": "convert",
        "artifacts": {"target_dir": str(pair.target_dir), "draft_dir": str(pair.draft_dir)},
        "decisions": {"aux_layer_ids": AUX},
        "target": {"dtype": "float32"},
    }
    (workdir / "convert" / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    recipe = {
        "name": "tiny",
        "workdir": str(workdir),
        "target": {"model": str(pair.target_dir), "dtype": "float32"},
        "draft": {"model": str(pair.draft_dir)},
        "runtime": {"device": "cpu"},
        **recipe_extra,
    }
    path = root / "tiny.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return path
