"""`specconvert generate RECIPE --prompt TEXT`: decode with the reference EAGLE-3 backend.

Reads the convert stage's output (``<workdir>/convert/manifest.json``), streams the
text to stdout and a summary (tau, per-position acceptance, tokens/s) to stderr;
``--json`` prints one document instead.
"""

from __future__ import annotations

import sys
import time
from typing import Optional

import typer
from typing_extensions import Annotated

from ._options import Command, JsonOpt, QuietOpt, RecipeArg, SetOpt, start
from .serve_cmd import ThreadsOpt, apply_threads, threads_setting

PromptOpt = Annotated[str, typer.Option("--prompt", "-p", metavar="TEXT", help="Prompt text.", show_default=False)]


def generate(
    recipe: RecipeArg,
    prompt: PromptOpt,
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", min=1, metavar="N", help="Most new tokens.")] = 128,
    temperature: Annotated[float, typer.Option("--temperature", "-t", min=0.0, metavar="T", help="0 = greedy.")] = 0.0,
    top_p: Annotated[float, typer.Option("--top-p", min=0.0, max=1.0, metavar="P", help="Nucleus sampling mass.")] = 1.0,
    top_k: Annotated[int, typer.Option("--top-k", min=0, metavar="K", help="Keep the k most likely tokens (0 = all).")] = 0,
    seed: Annotated[Optional[int], typer.Option("--seed", metavar="N", help="Seed for sampling.", show_default=False)] = None,
    baseline: Annotated[bool, typer.Option("--baseline", help="Plain decoding without speculation (same target wrapper).")] = False,
    raw: Annotated[bool, typer.Option("--raw", help="Do not apply the tokenizer's chat template.")] = False,
    threads: ThreadsOpt = None,
    set_: SetOpt = None,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Generate text with the reference EAGLE-3 decoder (or the plain baseline)."""
    from .. import output
    from ..errors import InputError
    from ..manifest import require_manifest

    loaded = start(recipe, set_, json_out, quiet)
    setting = threads_setting(threads, loaded)
    manifest = require_manifest(loaded.workdir_path / "convert", "convert", "convert")
    chosen = apply_threads(setting)

    from ..reference import DecodeSettings, ReferenceDecoder, summarise

    if json_out or quiet:  # stderr stays empty: no weight-loading progress bars
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

    dtype = (manifest.get("target") or {}).get("dtype") or loaded.target.dtype
    output.log(f"loading target and draft head from {loaded.workdir_path / 'convert'}")
    dec = ReferenceDecoder.from_convert_manifest(manifest, device=loaded.runtime.device, dtype=dtype)
    tok = dec.tokenizer
    if tok is None:
        raise InputError(
            f"the target folder {manifest['artifacts']['target_dir']} has no tokenizer",
            fix="re-run `specconvert convert RECIPE --force` so the tokenizer is saved with the target",
        )
    templated = bool(getattr(tok, "chat_template", None)) and not raw
    if templated:
        text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
        prompt_ids = tok(text, add_special_tokens=False)["input_ids"]
    else:
        prompt_ids = tok(prompt)["input_ids"]
    if not prompt_ids:
        raise InputError("the prompt encodes to no tokens", fix="give a non-empty --prompt")

    build = loaded.build
    settings = DecodeSettings(
        max_draft_len=build.max_draft_len,
        tree=build.tree.model_dump() if build.tree else None,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        stop_token_ids=dec.eos_token_ids,
        speculative=not baseline,
    )

    records, generated, shown = [], [], ""
    t0 = time.perf_counter()
    for step in dec.stream(prompt_ids, max_tokens, settings):
        records.append(step)
        generated += step.token_ids
        if not json_out:
            text = tok.decode(generated, skip_special_tokens=True)
            if text.startswith(shown):
                sys.stdout.write(text[len(shown):])
                sys.stdout.flush()
                shown = text
    res = summarise(list(prompt_ids), records, time.perf_counter() - t0)
    text = tok.decode(res.token_ids, skip_special_tokens=True)
    mode = "baseline" if baseline or dec.head is None else ("tree" if settings.tree else f"chain-{settings.max_draft_len}")
    if json_out:
        output.emit_json(
            "generate",
            {
                "mode": mode,
                "prompt": prompt,
                "chat_template": templated,
                "prompt_token_ids": list(prompt_ids),
                "token_ids": res.token_ids,
                "text": text,
                "settings": {"temperature": temperature, "top_p": top_p, "top_k": top_k, "seed": seed,
                             "max_tokens": max_tokens, "max_draft_len": settings.max_draft_len, "tree": settings.tree},
                "device": str(dec.target.device),
                "threads": chosen,
                "dtype": str(dec.target.dtype).replace("torch.", ""),
                **res.summary(),
            },
        )
        return
    if shown != text:
        sys.stdout.write(text[len(shown):] if text.startswith(shown) else "\n" + text)
    sys.stdout.write("\n")
    sys.stdout.flush()
    per_pos = ", ".join(f"{x:.2f}" for x in res.per_position_acceptance) or "-"
    output.log(
        f"{mode}: {len(res.token_ids)} tokens in {res.wall_time_s:.2f} s ({res.tokens_per_second:.1f} tok/s), "
        f"{res.steps} target steps, tau {res.acceptance_length:.2f}, per-position acceptance ({per_pos}), "
        f"finish {res.finish_reason}"
    )


def register(app: typer.Typer) -> None:
    app.command("generate", cls=Command)(generate)
