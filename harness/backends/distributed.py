"""Process setup shared by the GPU engines: the CUDA guard and one ``torch.distributed`` world.

Both GPU engines live in the same process (vLLM with ``distributed_executor_backend=
"external_launcher"`` reuses an initialised default group; megatron-core requires one), so the
world is made once here: from torchrun's ``RANK`` / ``WORLD_SIZE`` / ``MASTER_*`` variables, or
as a world of one when the run was started without torchrun.
"""

from __future__ import annotations

import os

import torch


def require_cuda(backend: str) -> None:
    """Fail early, before importing vLLM or megatron-core, on a machine without a GPU."""
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"backend {backend!r} needs a CUDA GPU and none is visible; on this machine use "
            "backend=hf (transformers on CPU or GPU)")


def ensure_distributed() -> tuple[int, int]:
    """Initialise the default process group (NCCL) if needed; returns (rank, world size)."""
    import torch.distributed as dist

    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    if not dist.is_initialized():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl", init_method="env://")
    return dist.get_rank(), dist.get_world_size()


def rank() -> int:
    """This process's global rank (0 without torchrun)."""
    return int(os.environ.get("RANK", "0"))
