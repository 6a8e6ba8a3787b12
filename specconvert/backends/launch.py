"""Launch files of the deployment bundle: trtllm-serve / trtllm-bench, vLLM, SGLang.

Scripts point at the target and draft (absolute paths) rather than copying them. Every
script is rendered by ``render_script``: each word ``shlex.quote``d, comment lines with
control characters escaped, environment defaults assigned on their own lines. Paths,
model names and JSON arguments therefore reach the program as one argument each, and
nothing from a recipe or a path is ever run (issue 11, item 5). ``runtime.host`` is
also validated by the recipe schema.

vLLM and SGLang take the auxiliary layers from the draft's ``config.json`` only, and
each reads a different key in a different numbering, so each gets a small draft
overlay (a rewritten ``config.json`` beside symlinks to the draft's other files):

- SGLang reads ``eagle_config.eagle_aux_hidden_state_layer_ids`` in the *output*
  convention and adds 1 itself (``set_eagle3_layers_to_capture``:
  ``layers_to_capture = [val + 1 for val in layer_ids]``, then captures the input of
  those layers). Its internal capture ids are therefore output + 1; the config value
  is the same list TensorRT-LLM gets.
- vLLM reads the top-level ``eagle_aux_hidden_state_layer_ids``
  (``get_eagle3_aux_layers_from_config``) and uses it directly as the layers whose
  *input* it captures (``if idx in self.aux_hidden_state_layers: aux.append(hidden_states
  + residual)`` before layer ``idx``), so it needs output + 1. Its fallback, the
  ``eagle_config`` list, is taken unshifted, so the vLLM overlay writes output + 1 there too.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import unicodedata
from pathlib import Path
from typing import Any, Callable, Sequence

# trtllm-bench dataset rows: {"task_id", "prompt" | "input_ids", "output_tokens"}
# (TensorRT-LLM docs, performance/perf-benchmarking: "Preparing a Dataset").
BENCH_PROMPTS = (
    "Explain speculative decoding to a new engineer in three sentences.",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Summarise the causes of the French Revolution in a short paragraph.",
    "List five practical tips for writing clear commit messages.",
    "Translate to German: The weather is nice today and we will go for a walk.",
    "What is the difference between a process and a thread?",
    "Write a haiku about a GPU running out of memory.",
    "Describe how a hash map handles collisions.",
)
BENCH_OUTPUT_TOKENS = 128


class Shell(str):
    """Text written into a script as is (not quoted): only constant fragments authored in this
    module, such as ``"$HOST"`` or ``"$HERE/dataset.jsonl"``. Recipe values and paths never are."""


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


def write_executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # surrogateescape: a path that is not valid UTF-8 keeps its original bytes in the script.
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    path.chmod(0o755)


def sglang_config_aux_ids(aux_layer_ids: list[int]) -> list[int]:
    """The value for SGLang's ``eagle_config.eagle_aux_hidden_state_layer_ids``: the output convention."""
    return [int(i) for i in aux_layer_ids]


def sglang_captured_layers(config_ids: list[int]) -> list[int]:
    """Which layers' *input* SGLang captures for a config value (it adds 1 itself)."""
    return [int(i) + 1 for i in config_ids]


def vllm_config_aux_ids(aux_layer_ids: list[int]) -> list[int]:
    """The value for vLLM's top-level ``eagle_aux_hidden_state_layer_ids``: input of layer i+1 = output of i."""
    return [int(i) + 1 for i in aux_layer_ids]


def chain_or_tree(build: Any) -> dict[str, int]:
    """SGLang's steps / top-k / draft tokens for the recipe's chain or tree (T <= S*K + 1)."""
    if build.tree is None:
        steps, topk = build.max_draft_len, 1
        tokens = steps + 1
    else:
        steps, topk = build.tree.depth, build.tree.top_k
        tokens = min(build.tree.total_tokens, steps * topk + 1)
    return {"steps": steps, "topk": topk, "draft_tokens": tokens}


def _endpoint(runtime: Any) -> dict[str, Any]:
    return {"HOST": runtime.host, "PORT": runtime.port}


def trtllm_serve(target_dir: str, build: Any, runtime: Any, title: str) -> str:
    parallel = ["--tp_size", build.tensor_parallel_size]
    if build.moe_expert_parallel_size > 1:
        parallel += ["--ep_size", build.moe_expert_parallel_size]
    return render_script(
        title,
        ["trtllm-serve with EAGLE-3. Generated by `specconvert build`; regenerate rather than edit.",
         "  engine/trtllm/serve.sh                                   # speculative, 127.0.0.1:$PORT",
         "  OPTIONS=engine/trtllm/baseline.yaml engine/trtllm/serve.sh   # same settings, no speculation",
         "Multi-GPU / multi-node: see docs/build.md (trtllm-llmapi-launch under Slurm/MPI)."],
        {**_endpoint(runtime), "OPTIONS": Shell('"$HERE/llm_api_options.yaml"')},
        [["trtllm-serve", target_dir],
         ["--backend", "pytorch"],
         ["--host", env("HOST"), "--port", env("PORT")],
         parallel,
         ["--extra_llm_api_options", env("OPTIONS")]],
    )


def trtllm_bench(target_dir: str, title: str) -> str:
    return render_script(
        title,
        ["trtllm-bench latency on the bundle's dataset. Generated by `specconvert build`.",
         "  engine/trtllm/bench.sh                                   # speculative",
         "  OPTIONS=engine/trtllm/baseline.yaml REPORT=base.json engine/trtllm/bench.sh"],
        {"OPTIONS": Shell('"$HERE/llm_api_options.yaml"'), "REPORT": Shell('"$PWD/trtllm_bench_report.json"')},
        [["trtllm-bench", "--model", target_dir, "--model_path", target_dir, "latency"],
         ["--dataset", Shell('"$HERE/dataset.jsonl"')],
         ["--extra_llm_api_options", env("OPTIONS")],
         ["--report_json", env("REPORT")]],
    )


def bench_dataset() -> str:
    rows = [
        {"task_id": i, "prompt": prompt, "output_tokens": BENCH_OUTPUT_TOKENS} for i, prompt in enumerate(BENCH_PROMPTS)
    ]
    return "".join(json.dumps(row) + "\n" for row in rows)


def vllm_serve(target_dir: str, draft_dir: str, build: Any, runtime: Any, title: str, name: str = "specconvert",
               tuned: dict[str, Any] | None = None) -> str:
    """The bundle's vLLM ``serve.sh``: argv built once in ``backends.vllm.launch`` (also what serve-test runs);
    ``tuned``: vLLM's schedule from `specconvert tune`."""
    from .vllm.launch import serve_script

    return serve_script(target_dir, draft_dir, build, runtime, name, title, tuned=tuned)


def vllm_serve_baseline(target_dir: str, build: Any, runtime: Any, title: str, name: str = "specconvert") -> str:
    """``serve-baseline.sh``: the same server without speculation (the lossless and speed baseline)."""
    from .vllm.launch import serve_script

    return serve_script(target_dir, None, build, runtime, name, title)


def sglang_serve(target_dir: str, draft_dir: str, build: Any, runtime: Any, title: str,
                 tuned: dict[str, Any] | None = None) -> str:
    """SGLang's launch line; ``tuned`` (from `specconvert tune`) replaces the recipe's draft shape,
    and without speculation (``tuned["speculate"]`` false) the target is served alone."""
    shape = chain_or_tree(build)
    parallel = ["--tp-size", build.tensor_parallel_size]
    if build.moe_expert_parallel_size > 1:
        parallel += ["--ep-size", build.moe_expert_parallel_size]
    if tuned is not None and not tuned["speculate"]:
        spec: list[list[Any]] = []
        note = "Tuned (`specconvert tune`): speculation does not pay here, so the target is served alone."
    else:
        steps, topk, tokens = shape["steps"], shape["topk"], shape["draft_tokens"]
        if tuned is not None:
            steps, topk, tokens = tuned["draft_len"], 1, tuned["draft_len"] + 1
        spec = [["--speculative-algorithm", "EAGLE3"],
                ["--speculative-draft-model-path", draft_dir],
                ["--speculative-num-steps", steps, "--speculative-eagle-topk", topk],
                ["--speculative-num-draft-tokens", tokens]]
        note = ("Tuned (`specconvert tune`): the draft length measured best here." if tuned is not None else
                "The recipe's draft shape (run `specconvert tune` to measure the best one).")
    return render_script(
        title,
        ["SGLang with EAGLE-3. Generated by `specconvert build`.",
         "The draft path is the bundle's overlay: its config.json carries eagle_config.",
         "eagle_aux_hidden_state_layer_ids in the output convention (SGLang adds 1 itself).", note],
        _endpoint(runtime),
        [["python3", "-m", "sglang.launch_server", "--model-path", target_dir],
         ["--host", env("HOST"), "--port", env("PORT")],
         parallel + ["--context-length", build.max_seq_len], *spec],
    )


# How each file numbers the aux layers, as recorded in the bundle manifest.
OUTPUT_NUMBERING = "output of layer i (0-based; Model Optimizer export, TensorRT-LLM, SGLang's config value)"
VLLM_NUMBERING = "input of layer i = output of layer i-1 (vLLM)"
AUX_KEY = "eagle_aux_hidden_state_layer_ids"
# Files that make an engine load a folder as a quantized checkpoint (Model Optimizer's export).
DRAFT_QUANT_FILES = ("hf_quant_config.json", "quant_cfg.json")


def write_draft_overlay(draft_dir: Path, overlay: Path,
                        config_update: Callable[[dict], dict[str, Any] | None]) -> dict[str, Any]:
    """A draft folder for one engine: ``config.json`` rewritten by ``config_update`` + symlinks to the rest.

    ``config_update`` edits the config in place and returns ``{key path: {"ids", "numbering"}}``
    for the aux-layer lists it wrote; that goes into the result (and so into the manifest).
    """
    overlay.mkdir(parents=True, exist_ok=True)
    config_path = draft_dir / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    aux_layer_ids = config_update(config) or {}
    # The draft keeps its own precision: convert exports it unquantized (bf16/fp16/fp32, checked
    # tensor by tensor), so a quantization config here can only be one inherited from the target.
    # vLLM 0.32 builds the drafter's quant config from the draft's own config
    # (vllm/model_executor/models/utils.py get_draft_quant_config; vllm/config/speculative.py copies
    # the target's `quantization` only when the draft IS the target: mtp, dspark), and it finds a
    # Model Optimizer checkpoint by hf_quant_config.json beside config.json
    # (vllm/transformers_utils/config.py); SGLang reads the draft folder the same way.
    dropped = ["config.json quantization_config"] if config.pop("quantization_config", None) is not None else []
    (overlay / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    linked = []
    for item in sorted(draft_dir.iterdir()) if draft_dir.is_dir() else []:
        if item.name == "config.json" or item.name.startswith("."):
            continue
        if item.name in DRAFT_QUANT_FILES:
            dropped.append(item.name)
            continue
        os.symlink(item.resolve(), overlay / item.name)
        linked.append(item.name)
    return {"config": "config.json", "linked": linked, "aux_layer_ids": aux_layer_ids,
            "draft_precision": {"quantization": None, "dropped": dropped}}


def sglang_overlay_update(aux_layer_ids: list[int]) -> Callable[[dict], dict[str, Any]]:
    def update(config: dict) -> dict[str, Any]:
        ids = sglang_config_aux_ids(aux_layer_ids)
        eagle = dict(config.get("eagle_config") or {})
        eagle[AUX_KEY] = ids
        config["eagle_config"] = eagle
        written = {f"eagle_config.{AUX_KEY}": {"ids": ids, "numbering": OUTPUT_NUMBERING}}
        # SGLang reads only eagle_config; a stale top-level list (some heads carry one) would
        # mislead a reader of this overlay, so it is dropped.
        config.pop(AUX_KEY, None)
        return written

    return update


def vllm_overlay_update(aux_layer_ids: list[int]) -> Callable[[dict], dict[str, Any]]:
    """vLLM's numbering in BOTH places: this overlay is vLLM's own copy of the config.

    vLLM 0.32 (``vllm/v1/worker/gpu_model_runner.py``, ``_get_eagle3_aux_layers_from_config``)
    reads the top-level list and, only when that is missing or empty, falls back to
    ``eagle_config.eagle_aux_hidden_state_layer_ids`` WITHOUT adding 1 (it shifts only
    DFlash's ``target_layer_ids``). Keeping the head's output-numbered list there would run
    one layer off, silently, the day the top-level key is lost. ``llama_eagle3.py`` reads
    only the length of the ``eagle_config`` list (the fc input width), which is unchanged.
    """

    def update(config: dict) -> dict[str, Any]:
        ids = vllm_config_aux_ids(aux_layer_ids)
        config[AUX_KEY] = ids
        eagle = dict(config.get("eagle_config") or {})
        eagle[AUX_KEY] = list(ids)
        config["eagle_config"] = eagle
        return {key: {"ids": ids, "numbering": VLLM_NUMBERING} for key in (AUX_KEY, f"eagle_config.{AUX_KEY}")}

    return update


def aux_layer_numbering(aux_layer_ids: list[int]) -> dict[str, Any]:
    """For the bundle manifest: which aux-layer list each file holds, and in which numbering."""
    output = {"ids": [int(i) for i in aux_layer_ids], "numbering": OUTPUT_NUMBERING}
    vllm = {"ids": vllm_config_aux_ids(aux_layer_ids), "numbering": VLLM_NUMBERING}
    return {
        f"convert/draft/config.json: eagle_config.{AUX_KEY}": output,
        "engine/trtllm/llm_api_options.yaml: speculative_config.eagle3_layers_to_capture": output,
        f"engine/sglang/draft/config.json: eagle_config.{AUX_KEY}": output,
        f"engine/vllm/draft/config.json: {AUX_KEY}": vllm,
        f"engine/vllm/draft/config.json: eagle_config.{AUX_KEY}": vllm,
    }
