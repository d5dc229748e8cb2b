"""torch.distributed glue: the same trainer runs as one process or under ``torchrun`` (DDP or FSDP2).

The process group is set up from torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``): NCCL on CUDA, gloo on CPU. No process management of our own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from hybrid_attention.device import resolve_device


@dataclass
class DistContext:
    """Where this process sits: rank, world size and the device it trains on."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def gather_to_main(self, obj: object) -> list[object] | None:
        """Every rank's ``obj`` (picklable) in rank order on rank 0, None on the others; ``[obj]`` in one process."""
        if not self.enabled:
            return [obj]
        out: list[object] | None = [None] * self.world_size if self.is_main else None
        dist.gather_object(obj, out, dst=0)
        return out

    def all_reduce_mean(self, t: torch.Tensor) -> torch.Tensor:
        """Mean of ``t`` over ranks (returns a new tensor; a no-op copy in a single process)."""
        t = t.detach().clone()
        if self.enabled:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            t /= self.world_size
        return t

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        t = t.detach().clone()
        if self.enabled:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t


def init_distributed(device_name: str) -> DistContext:
    """Initialise the process group when launched by torchrun (WORLD_SIZE > 1); otherwise a single-process context."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_name, local_rank)
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        device_id = device if backend == "nccl" else None
        dist.init_process_group(backend=backend, rank=rank, world_size=world, device_id=device_id)
    return DistContext(rank, world, local_rank, device)


def shutdown_distributed(ctx: DistContext, finished: bool = False) -> None:
    """Tear the process group down. ``finished`` (every rank returned from training): wait for all ranks first, so no
    rank closes its connections while a peer is still inside the last collective (gloo aborts that peer)."""
    if ctx.enabled and dist.is_initialized():
        if finished:
            dist.barrier()
        dist.destroy_process_group()


def wrap_model(model: nn.Module, ctx: DistContext, parallel: str) -> nn.Module:
    """DDP or FSDP2 (``fully_shard`` on every decoder block, then the root) in a distributed run; else the model."""
    if not ctx.enabled:
        return model
    if parallel == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in getattr(getattr(model, "model", model), "layers", []):
            fully_shard(block)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)


def unwrap(model: nn.Module) -> nn.Module:
    """The user model under a DDP wrapper (FSDP2 shards in place, so it is its own user model)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
