"""``draft.train`` end to end, for the convert stage: data, draft vocabulary, training.

Everything reusable lives under ``<workdir>/cache/train/``: the synthesis cache
(JSONL, appended batch by batch) and the training checkpoint (named by a fingerprint
of the data and the settings that shape the run; the budget and the evaluation
settings are left out, so a rerun with a larger ``max_minutes`` continues).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import output, threads
from .._imports import require
from ..errors import EnvironmentMissing, InputError
from ..prompts.overlap import split_holdout as split_holdout_by_prompt  # duplicates on one side (issue 37, item 7)
from .data import DataReport, TrainSequence, build_sequences, fingerprint, load_prompt_samples
from .prompt_sets import check_prompt_sets, prompt_specs
from .trainer import Trainer, TrainResult, build_train_model, check_target_layer, init_from_target_layer
from .vocab import DraftVocab, calibrate


@dataclass
class TrainedHead:
    tensors: dict[str, Any]
    arch: Any
    vocab: DraftVocab
    data: DataReport
    result: TrainResult
    dtype: str
    processes: int = 1
    layer_init: dict[str, Any] = field(default_factory=lambda: {"kind": "random"})

    def manifest_section(self) -> dict[str, Any]:
        return {
            "data": self.data.as_dict(),
            "draft_vocab": self.vocab.as_dict(),
            "dtype": self.dtype,
            "processes": self.processes,
            "layer_init": self.layer_init,
            **self.result.as_dict(),
        }


def cache_dir(recipe: Any) -> Path:
    return recipe.workdir_path / "cache" / "train"


def preflight(recipe: Any, target_vocab: int) -> None:
    """Input checks that must fail before any model is loaded."""
    from ..backends.modelopt.eagle import generation, modelopt_version

    train = recipe.draft.train
    if generation() != "new":
        raise EnvironmentMissing(
            f"training a head needs Model Optimizer >= 0.43 (installed: {modelopt_version()})",
            fix="pip install 'nvidia-modelopt>=0.43', or import a trained head with draft.model",
        )
    check_prompt_sets(train, recipe.base_dir)
    for n, spec in enumerate(train.texts):
        load_prompt_samples(spec, f"draft.train.texts[{n}]", recipe.base_dir)
    if train.eval_prompts:
        load_prompt_samples(train.eval_prompts, "draft.train.eval_prompts", recipe.base_dir)
    if train.synthesize and train.synthesis.engine == "vllm":
        from ..backends.vllm import launch
        from .answers.vllm import SYNTHESIS_INSTEAD, SYNTHESIS_NEEDS

        launch.find_python(recipe.runtime, launch.project_roots(recipe.base_dir / "recipe.yaml"),  # exit 3 before any load
                           SYNTHESIS_NEEDS, SYNTHESIS_INSTEAD)
    if train.synthesize and train.synthesis.engine == "url":
        from .answers.sources import check_endpoints

        check_endpoints(train.synthesis)  # GET /v1/models on every URL: a wrong URL fails in seconds, before any load
    size = vocab_size(recipe, target_vocab)
    if size > target_vocab:
        raise InputError(
            f"draft.train.draft_vocab_size: {size} is larger than the target's vocabulary ({target_vocab})",
            fix=f"use at most {target_vocab}",
        )


def vocab_size(recipe: Any, target_vocab: int) -> int:
    return recipe.draft.train.draft_vocab_size or recipe.draft.draft_vocab_size or target_vocab


def train_dtype(spec: str, device: str) -> str:
    """The training precision: a torch dtype name, or ``bf16-mixed`` (float32 weights and optimizer, bf16 autocast)."""
    if spec != "auto":
        return spec
    return "bfloat16" if device == "cuda" else "float32"


def cpu_has_bf16_matmul() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AMX tiles or AVX-512 BF16).

    Elsewhere (AVX2-only CPUs) bf16 is emulated and slower than float32, so convert warns when
    ``bf16-mixed`` is asked for on such a CPU.
    """
    torch = require("torch")
    cpu = getattr(torch, "cpu", None)
    for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        fn = getattr(cpu, probe, None)
        try:
            if fn is not None and fn():
                return True
        except Exception:  # noqa: BLE001 - a probe that cannot answer means "no"
            pass
    return False


def emulated_bf16(dtype_name: str, device: str) -> bool:
    """bf16 training asked for on a CPU that would emulate it (slower than float32)."""
    return dtype_name in ("bf16-mixed", "bfloat16") and device.startswith("cpu") and not cpu_has_bf16_matmul()


def param_dtype(dtype_name: str) -> str:
    """The dtype the head's weights are held in (``bf16-mixed`` keeps them in float32)."""
    return "float32" if dtype_name == "bf16-mixed" else dtype_name


def data_fingerprint(recipe: Any) -> dict[str, Any]:
    """Identity of the prompt and text files (part of the convert stage's fingerprint).

    ``python:docs`` is identified by the Python version that ships it.
    """
    import sys

    from ..manifest import file_fingerprint
    from ..prompts import source_path

    train = recipe.draft.train
    specs = [*prompt_specs(train.prompts), *train.texts] + ([train.eval_prompts] if train.eval_prompts else [])
    out: dict[str, Any] = {}
    for spec in specs:
        path = source_path(spec, "draft.train", recipe.base_dir)
        out[spec] = file_fingerprint(path) if path is not None else sys.version
    return out


def head_settings_key(spec: Any) -> dict[str, Any]:
    """The ``draft.train`` settings that shape the head (part of its checkpoint's key).

    Left out: what only bounds or reports the run, and ``synthesis`` (engine, URLs,
    sampling), which shapes the data, whose tokens are in the key already. The default
    ``layer_init`` adds nothing, so checkpoints written before the key existed stay valid.
    """
    exclude = {"max_minutes", "eval_prompts", "eval_samples", "eval_max_new_tokens", "checkpoint_every", "synthesis",
               "features"}
    if spec.layer_init == "random":
        exclude.add("layer_init")
    return spec.model_dump(mode="json", exclude=exclude)


def split_holdout(sequences: list[TrainSequence], fraction: float, seed: int) -> tuple[list[TrainSequence], list[TrainSequence]]:
    if fraction <= 0 or len(sequences) < 4:
        return sequences, []
    order = list(range(len(sequences)))
    random.Random(seed).shuffle(order)
    n = max(1, int(round(fraction * len(sequences))))
    # Whole groups (several answers to one prompt) go to one side: a held-out answer whose prompt is trained on
    # with other answers would flatter the estimate. Sequences without a group are groups of one (the same split
    # as before groups existed).
    members: dict[Any, list[int]] = {}
    for i, s in enumerate(sequences):
        members.setdefault(("group", s.group) if s.group is not None else ("one", i), []).append(i)
    held: set[int] = set()
    for i in order:
        if len(held) >= n:
            break
        s = sequences[i]
        held.update(members[("group", s.group) if s.group is not None else ("one", i)])
    if len(held) == len(sequences):
        return sequences, []
    return [s for i, s in enumerate(sequences) if i not in held], [sequences[i] for i in sorted(held)]


def train_head(recipe: Any, target_path: Path, target_fingerprint: str, device: str, target_dtype: str,
               aux_layer_ids: list[int]) -> TrainedHead:
    """Synthesize data, calibrate the draft vocabulary, train; returns the best head's canonical tensors."""
    torch = require("torch")
    transformers = require("transformers")
    from ..backends.modelopt.eagle import EagleArch
    from ..reference.decoder import eos_ids

    from . import distributed, sharded

    spec = recipe.draft.train
    cache = cache_dir(recipe)
    world = distributed.current()
    device = distributed.device_for(world, device)  # the process group is joined after the data (distributed.py)
    if not world.main:
        output.set_mode(quiet=True)  # one process reports
    dtype_name = train_dtype(spec.dtype, device.split(":")[0])
    dtype = getattr(torch, param_dtype(dtype_name))
    if emulated_bf16(dtype_name, device):
        output.warn(f"draft.train.dtype: {dtype_name} on a CPU without bf16 units (AMX or AVX-512 BF16) is emulated and "
                    "slower than float32; set draft.train.dtype: float32 here")
    torch.manual_seed(spec.seed)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(target_path), trust_remote_code=recipe.target.trust_remote_code)
    stop_ids = list(eos_ids(target_path, tokenizer))
    torch_dtype = getattr(torch, target_dtype)
    trust = recipe.target.trust_remote_code
    later = target_after_data(spec)
    if later:
        # The data phase needs the target only to answer the probe (a served engine writes and answers): a copy on
        # the CPU, loaded when a probe runs, freed before the training copy loads.
        target = LazyTarget(lambda: load_whole_target(target_path, "cpu", torch_dtype, trust))
    else:
        with output.progress() as bar:
            task = bar.add_task("load target for training", total=1)
            target = load_whole_target(target_path, device, torch_dtype, trust)
            bar.advance(task)
    if spec.layer_init == "target":  # before any synthesis: a target it cannot start from is refused now
        check_target_layer(empty_target(target_path, torch_dtype, trust) if later else target, aux_layer_ids)
    threads.apply_for_phase(recipe.runtime.threads, "synthesis")
    # The data phase runs before the process group exists (its exchanges go through files): a collective would
    # time out while process 0 synthesizes for hours. A served source (a vLLM started here, or the user's URLs)
    # lives only while the data is built: a started server is stopped, on every exit path, before training
    # needs the memory.
    data_world = distributed.before_group(world, cache / "exchange")
    with answer_source(recipe, target, tokenizer, stop_ids, target_path, target_dtype, cache) as source, \
            output.progress() as bar:
        sequences, data = build_sequences(spec, recipe.base_dir, target, tokenizer, stop_ids, cache, target_fingerprint,
                                          bar, data_world, source=source,
                                          eval_sets=[(recipe.quantize.eval_prompts, "quantize.eval_prompts")])
    device = distributed.init(world, device)
    distributed.end_data_phase(data_world)
    if later:
        target.release()
        with output.progress() as bar:
            task = bar.add_task("load target for training", total=1)
            if spec.target_sharding == "fsdp":  # each process holds 1/N of the target (training/sharded.py)
                target = sharded.load_target(target_path, world, device, torch_dtype, trust)
            else:
                target = load_whole_target(target_path, device, torch_dtype, trust)
            bar.advance(task)
    if data.synthesized_tokens:
        rate = data.synthesized_tokens / data.synthesis_s if data.synthesis_s > 0 else 0.0
        cached = f", {data.synthesis_cached} from the cache" if data.synthesis_cached else ""
        if data.synthesis_cached >= data.answers:  # nothing was generated: a rate would divide cached tokens by reading time
            rate, cached = None, ", all from the cache"
        gaps = [p["mean_gap"] for p in data.probe if p.get("mean_gap") is not None]
        probed = (f"; probe: {data.probe_tokens} tokens scored by the in-process target"
                  + (f", mean logprob gap {max(gaps):.2g} nats" if gaps else "")) if data.probe_tokens else ""
        written = (f" ({data.self_prompts} written by the target in {data.self_prompts_s:.0f} s, {data.self_prompts_engine})"
                   if data.self_prompts else "")
        output.log(f"train data: {data.prompts} prompts{written}, {data.answers} answers ({spec.synthesis.engine}), "
                   f"{data.synthesized_tokens} synthesized tokens in {data.synthesis_s:.0f} s "
                   f"({f'{rate:.0f} tok/s' if rate is not None else 'read back'}{cached}{probed}); "
                   f"{data.text_tokens} teacher-forced text tokens")
    if spec.features == "quantized":
        _quantize_target(recipe, target, tokenizer)
    train_set, holdout = split_holdout_by_prompt(sequences, spec.holdout_fraction, spec.seed)
    config = target.config
    vocab = calibrate(train_set, config.vocab_size, vocab_size(recipe, config.vocab_size), always=stop_ids)
    output.check(True, f"draft vocabulary: {len(vocab.used)} of {config.vocab_size} target tokens, "
                       f"covering {vocab.coverage:.1%} of trained tokens ({vocab.distinct_trained} distinct)")
    arch = EagleArch.for_target(config, len(vocab.used), recipe.draft.num_layers)
    model = build_train_model(target, arch, aux_layer_ids, vocab.used, spec.ttt_steps, dtype, torch.device(device), spec.seed)
    layer_init: dict[str, Any] = {"kind": spec.layer_init}
    if spec.layer_init == "target":
        layer_init.update(init_from_target_layer(model, target, aux_layer_ids))
        output.log(f"draft.train.layer_init: the draft layer starts as the target's layer {layer_init['target_layer']}")
    run_key = fingerprint(
        "train-v1",
        target_fingerprint,
        [(s.input_ids, s.loss_mask) for s in sequences],
        vocab.used,
        aux_layer_ids,
        arch.__dict__,
        dtype_name,
        head_settings_key(spec),
        # a quantized-feature head depends on the calibration too (nothing added otherwise: existing keys stay valid)
        *(["quantized features", recipe.quantize.model_dump(
            mode="json", include={"format", "calib_samples", "calib_seq_len", "calib_prompts"})]
          if spec.features == "quantized" else []),
    )
    features = sharded.feature_extractor(target, aux_layer_ids, world)
    trainer = Trainer(spec, model, features, train_set, holdout, torch.device(device), dtype,
                      cache / f"checkpoint-{run_key}.safetensors", run_key, world,
                      autocast=torch.bfloat16 if dtype_name == "bf16-mixed" else None)
    if trainer.load_checkpoint():
        output.log(f"draft.train: resuming from step {trainer.step} ({trainer.elapsed_s / 60:.1f} min done) "
                   f"of checkpoint {trainer.checkpoint_path}")
    processes = f" x {world.size} processes" if world.parallel else ""
    output.log(f"train: {len(train_set)} sequences ({sum(s.trained_tokens for s in train_set)} trained tokens), "
               f"{len(holdout)} held out; {trainer.total_steps} steps of batch {spec.batch_size}{processes}, dtype {dtype_name}, "
               f"budget {f'{spec.max_minutes:g} min' if spec.max_minutes else 'none'}")
    threads.apply_for_phase(recipe.runtime.threads, "training")
    with output.progress() as bar:
        result = trainer.run(bar, on_step=lambda step: _log_history(trainer, step))
    features.close()
    if result.stopped_by == "budget" and spec.steps is not None:
        output.warn(f"draft.train: max_minutes ({spec.max_minutes:g}) ran out at step {result.steps} of {spec.steps}, so this "
                    f"head is not the seeded {spec.steps}-step one; raise draft.train.max_minutes and rerun to finish "
                    f"(training resumes from the checkpoint)")
    output.check(True, f"trained {result.steps}/{result.total_steps} steps in {result.train_s / 60:.1f} min "
                       f"(stopped by {result.stopped_by}); best held-out tau estimate {result.best_score:.2f} at step {result.best_step}")
    return TrainedHead(result.tensors, arch, vocab, data, result, dtype_name, world.size, layer_init)


def target_after_data(spec: Any) -> bool:
    """Whether the training copy of the target is loaded after the data phase: when the target is sharded
    (a sharded model must never ``generate`` on one process: every forward is collective), and when a vLLM
    started here synthesizes (it would share the device with an idle copy of the target)."""
    return spec.target_sharding == "fsdp" or (spec.synthesize and spec.synthesis.engine == "vllm")


def load_whole_target(path: Path, device: str, dtype: Any, trust_remote_code: bool) -> Any:
    """The whole target on ``device``, in eval mode."""
    transformers = require("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, trust_remote_code=trust_remote_code)
    return model.to(device).eval()


def empty_target(path: Path, dtype: Any, trust_remote_code: bool) -> Any:
    """The target's modules without weights (meta device): its layer shapes, at no memory cost."""
    transformers = require("transformers")
    accelerate = require("accelerate")
    config = transformers.AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    with accelerate.init_empty_weights():
        return transformers.AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)


class LazyTarget:
    """A model loaded by ``load`` on its first use (an attribute or a call), dropped by :meth:`release`.

    The data phase's target when only a served engine's probe may need it: a run whose answers are all
    cached never loads it.
    """

    def __init__(self, load: Any):
        self._load = load
        self._model: Any = None

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def _get(self) -> Any:
        if self._model is None:
            self._model = self._load()
        return self._model

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._get(), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._get()(*args, **kwargs)

    def release(self) -> None:
        if self._model is not None:
            import gc

            self._model = None
            gc.collect()


def answer_source(recipe: Any, model: Any, tokenizer: Any, stop_ids: list[int], target_path: Path, target_dtype: str,
                  log_dir: Path) -> Any:
    """The ``draft.train.synthesis`` source, as a context manager (in-process ``generate`` when not synthesizing)."""
    from .answers.sources import open_source

    spec = recipe.draft.train
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (list(stop_ids) or [0])[0]
    engine_spec = spec.synthesis if spec.synthesize else spec.synthesis.model_copy(update={"engine": "inprocess", "urls": []})
    return open_source(engine_spec, model, tokenizer, stop_ids, pad_id, spec.synthesis_batch_size, target_path,
                       target_dtype, recipe, log_dir)


def _quantize_target(recipe: Any, target: Any, tokenizer: Any) -> None:
    """``draft.train.features: quantized``: the head learns the features the deployed (quantized) target produces."""
    from ..backends.modelopt.quantize import calibrate

    with output.progress() as bar:
        task = bar.add_task(f"calibrate {recipe.quantize.format} (train on the quantized target's features)",
                            total=recipe.quantize.calib_samples)
        calibrate(target, tokenizer, recipe.quantize, recipe.base_dir, on_batch=lambda: bar.advance(task))
    output.check(True, f"draft.train.features: quantized: training on {recipe.quantize.format} fake-quantized target features")


def _log_history(trainer: Trainer, step: int) -> None:
    if trainer.history and trainer.history[-1]["step"] == step:
        h = trainer.history[-1]
        output.log(f"  step {step}: train loss {h['train_loss']}, held-out loss {h['heldout_loss']}, "
                   f"held-out acc {h['heldout_acc']}, tau estimate {h['heldout_tau_estimate']} ({h['minutes']} min)")
