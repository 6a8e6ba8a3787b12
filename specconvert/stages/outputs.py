"""Reading what earlier stages wrote: convert's manifest (checked), tune's measurement, and the
draft length a built bundle serves at a given batch size.

build, tune, serve-test and bench read each other's outputs through here, so no stage module
imports another (build and tune used to import each other).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import output
from ..errors import InputError
from ..manifest import check_sealed, manifest_hash, read_manifest, require_manifest


def engine_dir(recipe: Any) -> Path:
    return recipe.workdir_path / "engine"


def tune_dir(recipe: Any) -> Path:
    return recipe.workdir_path / "tune"


def read_convert(recipe: Any, verify: bool = False) -> dict[str, Any]:
    """The convert manifest, checked for every field build and tune rely on (all problems at once), and
    the folders convert sealed checked as they are now: sizes and mtimes, every hash with ``verify``."""
    convert_dir = recipe.workdir_path / "convert"
    manifest = require_manifest(convert_dir, "convert", "convert")
    problems = []
    artifacts = manifest.get("artifacts") or {}
    for key in ("target_dir", "draft_dir"):
        value = artifacts.get(key)
        if not value:
            problems.append(f"convert manifest: artifacts.{key} is missing")
        elif not Path(value).is_dir():
            problems.append(f"convert manifest: artifacts.{key} = {value} is not a directory")
    aux = (manifest.get("decisions") or {}).get("aux_layer_ids")
    if not isinstance(aux, list) or not aux or not all(isinstance(i, int) for i in aux):
        problems.append("convert manifest: decisions.aux_layer_ids must be a non-empty list of integers")
    else:
        layers = (manifest.get("target") or {}).get("num_hidden_layers")
        if isinstance(layers, int) and any(i < 0 or i >= layers for i in aux):
            problems.append(f"convert manifest: decisions.aux_layer_ids {aux} outside the target's {layers} layers")
    if problems:
        raise InputError(
            f"{convert_dir / 'manifest.json'}: {problems[0]}"
            + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
            fix="rerun `specconvert convert RECIPE --force`",
            problems=problems,
        )
    check_sealed(recipe.workdir_path, manifest, "convert", full=verify)
    return manifest


def read_tune(recipe: Any) -> dict[str, Any] | None:
    """The tune manifest when a complete one exists, else None."""
    return read_manifest(tune_dir(recipe))


def tuned_measurement(recipe: Any, convert: dict[str, Any]) -> tuple[Any, str]:
    """What `specconvert tune` measured on this convert (a ``tuning.forms.Measurement``), or None and why
    it is not used. build derives each engine's schedule from it for its own settings."""
    from ..tuning.forms import Measurement

    tune = read_tune(recipe)
    where = tune_dir(recipe)
    if tune is None:
        return None, "no tune/ result: the recipe's draft shape is used (run `specconvert tune RECIPE` to measure)"
    if (tune.get("inputs") or {}).get("convert_manifest") != manifest_hash(convert):
        output.warn(f"{where} was measured on an older convert: ignored; rerun `specconvert tune RECIPE`")
        return None, "tune/ was measured on an older convert: ignored"
    try:
        measured = Measurement.from_dict(tune["measured"])
    except (KeyError, TypeError, ValueError, AttributeError):
        output.warn(f"{where} holds no measurement this specconvert reads (an older or edited tune): ignored; "
                    "rerun `specconvert tune RECIPE --force`")
        return None, "tune/ holds no measurement this specconvert reads: ignored"
    if recipe.build.tree is not None:
        output.warn("build.tree is set: tune measured chains only, so the recipe's tree is kept")
        return None, "build.tree is set: tune measures chains only"
    return measured, f"tuned by `specconvert tune` ({where})"


def served_draft_len(engine_manifest: dict[str, Any] | None, engine: str, batch_size: int, default: int) -> int:
    """The chain length the bundle's ``engine`` (trtllm | vllm | sglang | reference) drafts at ``batch_size``:
    its tuned schedule's entry for that batch (0 where it serves without speculation), else ``default``
    (the recipe's ``build.max_draft_len``) for a bundle built without a tune result."""
    form = (((engine_manifest or {}).get("decisions") or {}).get("tuned") or {}).get(engine)
    if form is None:
        return default
    if not form.get("speculate", True):
        return 0
    if engine == "trtllm":
        from ..backends.trtllm import schedule as trt

        return trt.draft_len_at(form.get("draft_len_schedule"), int(form["max_draft_len"]), batch_size,
                                form.get("draft_len_schedule_keys") or "upper_bound")
    if engine == "vllm":
        from ..backends.vllm import schedule as vllm

        return vllm.draft_len_at(form.get("num_speculative_tokens_per_batch_size"), int(form["num_speculative_tokens"]),
                                 batch_size)
    if engine == "sglang":
        return int(form["draft_len"])
    return int(form["max_draft_len"])  # the reference server: one request at a time
