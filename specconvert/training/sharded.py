"""Sharded target features: the target's weights spread over the data-parallel processes (FSDP2).

``draft.train.target_sharding: fsdp`` makes each of the ``num_processes`` processes hold
1/N of the target (every decoder layer, and the embeddings, final norm and lm_head, are
``torch.distributed.fsdp.fully_shard`` units), so a target larger than one device (a 70B
on 8 x 80 GB) can still feed a head. The head itself is small and stays replicated,
its gradients averaged as in plain data parallelism (``distributed.average_gradients``).

How the field does it (read, not copied):

- Model Optimizer (``examples/speculative_decoding/launch_train.sh``, main, 2026) trains
  EAGLE-3 under ``accelerate launch --fsdp full_shard --fsdp_config fsdp_config.json``
  (FSDP2 with transformers >= 5, ``--dp_shard_size``), the target and the head inside
  one sharded model; ``fsdp2_buffer_patch.py`` there describes accelerate's
  ``cpu_ram_efficient_loading``: rank 0 alone loads the checkpoint on CPU, the others
  build the model on the meta device, and rank 0 broadcasts each tensor into the
  shards (``fsdp2_load_full_state_dict``), with the same dtype on every rank.
- speculators (``src/speculators/train/distributed.py``, ``apply_fully_sharded``) applies
  ``fully_shard`` to each decoder layer, then to the root, under torchrun.

Loading here follows the accelerate scheme with torch's own
``set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True)``: device
memory per process is 1/N of the target, host memory on process 0 is one full copy
for the time of the load.

Every forward of a sharded model is collective (each unit all-gathers its weights), so
every process must run the same number of target forwards. :class:`ShardedFeatures`
and the trainer agree before each batch on the most forwards any of them will run
(:meth:`ShardedFeatures.even_out`); the others make up the difference with one-token
forwards, so feature caches and uneven last batches never leave a process waiting
forever.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from .. import output
from .._imports import require
from ..errors import InputError
from .distributed import World
from .trainer import FeatureExtractor


def _decoder_layers(model: Any) -> list[Any]:
    """The decoder layers: the one module list as long as the config's layer count."""
    torch = require("torch")
    count = model.config.num_hidden_layers
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count:
            return list(module)
    raise InputError(f"draft.train.target_sharding: fsdp finds no list of {count} decoder layers in {type(model).__name__}",
                     fix="use target_sharding: none for this target")


def load_target(path: Path, world: World, device: str, dtype: Any, trust_remote_code: bool = False) -> Any:
    """The target from ``path``, sharded over ``world`` (each process holds 1/``world.size`` of its weights).

    Collective: every process of the group calls it. Only process 0 reads the checkpoint.
    """
    import gc

    torch = require("torch")
    transformers = require("transformers")
    accelerate = require("accelerate")
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    full_state: dict[str, Any] = {}
    if world.main:
        full = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, trust_remote_code=trust_remote_code)
        config = full.config
        full_state = full.state_dict()
    else:
        config = transformers.AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    # Parameters on the meta device; buffers (rotary inv_freq) real, computed from the config.
    with accelerate.init_empty_weights():
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)
    if not getattr(model.config, "architectures", None):
        model.config.architectures = [type(model).__name__]  # fully_shard renames the class
    buffers = {name: buf.detach().clone() for name, buf in model.named_buffers()}
    mesh = init_device_mesh(torch.device(device).type, (world.size,))
    for layer in _decoder_layers(model):
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    # The root (embeddings, final norm, lm_head) is resharded after forward too: by default
    # FSDP2 keeps a root's weights gathered, a full lm_head per process for a 128k vocabulary.
    fully_shard(model, mesh=mesh, reshard_after_forward=True)
    model.to_empty(device=device)  # allocates this process's shards only
    with torch.no_grad():
        for name, value in buffers.items():
            model.get_buffer(name).copy_(value)
    set_model_state_dict(model, full_state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    if world.main:
        del full, full_state
        gc.collect()
    model.requires_grad_(False)
    model.eval()
    held, total = resident_parameters(model)
    output.log(f"draft.train.target_sharding: fsdp over {world.size} processes; each holds {held:,} of the target's "
               f"{total:,} parameters ({held / max(1, total):.1%})")
    return model


def is_sharded(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def resident_parameters(model: Any) -> tuple[int, int]:
    """(parameters this process holds, parameters of the whole model)."""
    held = total = 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        held += local.numel()
        total += p.numel()
    return held, total


class ShardedFeatures(FeatureExtractor):
    """Target features from a sharded target (collective; see the module doc on :meth:`even_out`).

    The forward goes through the root module, whose FSDP hooks gather the embeddings;
    ``logits_to_keep=1`` keeps the lm_head to one position. The final hidden state is
    the decoder's output, captured by a hook, as in :class:`FeatureExtractor`.
    """

    def __init__(self, model: Any, aux_layer_ids: Sequence[int], world: World):
        super().__init__(model, aux_layer_ids)
        self.world = world
        self._final: list[Any] = []
        self._handles.append(self.base.register_forward_hook(self._capture_final))

    def _capture_final(self, module, args, out):
        self._final.append(out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0])

    def __call__(self, input_ids: Any, attention_mask: Any) -> tuple[Any, Any]:
        torch = require("torch")
        self._captured.clear()
        self._final.clear()
        with torch.no_grad():
            self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=1)
        aux = torch.cat([self._captured[i] for i in self.aux_layer_ids], dim=-1)
        final = self._final[-1]
        self._captured.clear()
        self._final.clear()
        return aux, final

    def even_out(self, forwards: int) -> int:
        """Agree with the other processes on the most forwards any of them is about to run, and make
        up the difference here with one-token forwards first; returns how many were added.

        Every process calls it before the same batch (collective), so their forwards pair up.
        """
        torch = require("torch")
        import torch.distributed as dist

        device = next(iter(self.model.buffers()), None)
        device = device.device if device is not None else torch.device("cpu")
        count = torch.tensor([forwards], device=device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        padding = int(count.item()) - forwards
        token = torch.zeros((1, 1), dtype=torch.long, device=device)
        for _ in range(padding):
            self(token, torch.ones_like(token))
        return padding


def feature_extractor(target: Any, aux_layer_ids: Sequence[int], world: World) -> FeatureExtractor:
    """The feature extractor for ``target``: collective when it is sharded."""
    if world.parallel and is_sharded(target):
        return ShardedFeatures(target, aux_layer_ids, world)
    return FeatureExtractor(target, aux_layer_ids)
