"""Process setup shared by the GPU engines: the CUDA guard, one ``torch.distributed`` world, and
megatron-core's CPU mode.

Both GPU engines live in the same process (vLLM with ``distributed_executor_backend=
"external_launcher"`` reuses an initialised default group; megatron-core requires one), so the
world is made once here: from torchrun's ``RANK`` / ``WORLD_SIZE`` / ``MASTER_*`` variables, or
as a world of one when the run was started without torchrun.

**megatron-core on CPU** (``backend.device=cpu`` with ``backend.train=megatron``; fp32 only):
megatron-core 0.16.1 allocates on ``torch.cuda.current_device()``, names ``device="cuda"`` in a
few creation calls, and forks a CUDA RNG tracker around attention even at dropout 0. Nothing else
in its local (non-Transformer-Engine) layer spec needs CUDA, so :func:`enable_megatron_cpu`
gives the megatron modules -- and only them -- a view of ``torch`` whose CUDA device is the CPU
(``current_device()`` is ``"cpu"``, ``device="cuda"`` becomes ``"cpu"``, stream and synchronize
calls are no-ops), installs an RNG tracker whose ``fork()`` does nothing (there is no dropout
to seed), and replaces gradient clipping's by-norm scaling, which asserts CUDA tensor types, with
the same scaling on CPU. The rest of the process, transformers included, keeps the real
``torch``. What still needs CUDA: bf16/fp16 (``Float16Module`` and the mixed-precision
optimizer) and the distributed optimizer; the engine refuses both in this mode. It exists so
that CI checks the Megatron engine against the transformers one (forward, log-probs, entropy,
training steps, the HF export, tensor parallel over gloo processes), and so that the GPU check
can be dry-run on a CPU.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import tempfile
import types
from collections.abc import Iterator
from typing import Any

import torch


def require_cuda(backend: str) -> None:
    """Fail early, before importing vLLM or megatron-core, on a machine without a GPU."""
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"backend {backend!r} needs a CUDA GPU and none is visible; on this machine use "
            "backend=hf (transformers on CPU or GPU)")


def ensure_distributed(device: str = "cuda") -> tuple[int, int]:
    """Initialise the default process group if needed (NCCL on CUDA, gloo on CPU); returns
    (rank, world size). A CPU world of one rendezvouses through a fresh file, so concurrent
    processes (pytest workers) never race for a port."""
    import torch.distributed as dist

    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    if not dist.is_initialized():
        if device == "cpu":
            if int(os.environ["WORLD_SIZE"]) == 1:
                rdv = os.path.join(tempfile.mkdtemp(prefix="rlbench_dist_"), "rendezvous")
                dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=0,
                                        world_size=1)
            else:
                dist.init_process_group("gloo", init_method="env://")
        else:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
            dist.init_process_group("nccl", init_method="env://")
    return dist.get_rank(), dist.get_world_size()


def rank() -> int:
    """This process's global rank (0 without torchrun)."""
    return int(os.environ.get("RANK", "0"))


# -- megatron-core on CPU ------------------------------------------------------------------------
_FACTORIES = ("zeros", "ones", "empty", "full", "tensor", "as_tensor", "arange", "eye", "rand",
              "randn", "randint", "zeros_like", "ones_like", "empty_like", "full_like")


def _cpu_device(device: Any) -> Any:
    if isinstance(device, torch.device):
        return torch.device("cpu") if device.type == "cuda" else device
    if isinstance(device, str) and device.startswith("cuda"):
        return "cpu"
    if isinstance(device, int):  # a CUDA ordinal
        return "cpu"
    return device


def _on_cpu(fn: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        if "device" in kwargs:
            kwargs["device"] = _cpu_device(kwargs["device"])
        return fn(*args, **kwargs)

    call.__name__ = getattr(fn, "__name__", "factory")
    return call


class _NoStream:
    """What ``torch.cuda.current_stream()`` gives megatron on CPU: nothing to wait for."""

    def synchronize(self) -> None:
        pass

    def wait_stream(self, _other: Any) -> None:
        pass

    def wait_event(self, _event: Any) -> None:
        pass

    def record_event(self, _event: Any = None) -> None:
        return None


class _CpuCuda(types.ModuleType):
    """``torch.cuda`` as megatron sees it on CPU: the current device is the CPU."""

    def __init__(self) -> None:
        super().__init__("torch.cuda")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def synchronize(_device: Any = None) -> None:
        pass

    @staticmethod
    def current_stream(_device: Any = None) -> _NoStream:
        return _NoStream()

    @staticmethod
    def set_device(_device: Any) -> None:
        pass

    @staticmethod
    def stream(_stream: Any) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


class _CpuTorch(types.ModuleType):
    """``torch`` as megatron sees it on CPU: device-creating calls land on the CPU."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = _CpuCuda()
        for name in _FACTORIES:
            setattr(self, name, _on_cpu(getattr(torch, name)))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


class _NullRNGTracker:
    """Megatron's CUDA RNG tracker on CPU: ``fork()`` changes nothing. The engine runs at
    dropout 0, so no tracked random stream is ever drawn from."""

    def is_initialized(self) -> bool:
        return True

    def reset(self) -> None:
        pass

    def add(self, _name: str, _seed: int) -> None:
        pass

    def get_states(self) -> dict[str, Any]:
        return {}

    def set_states(self, _states: dict[str, Any]) -> None:
        pass

    @contextlib.contextmanager
    def fork(self, _name: str = "model-parallel-rng") -> Iterator[None]:
        yield


_CPU_TORCH: _CpuTorch | None = None


def enable_megatron_cpu() -> None:
    """Let megatron-core run on CPU in this process (see the module docstring). Idempotent;
    call it again after importing more megatron modules (each loaded ``megatron.core`` module
    gets the CPU view of ``torch``)."""
    global _CPU_TORCH
    if torch.cuda.is_available():
        raise RuntimeError("megatron CPU mode on a machine with a visible GPU: it would send "
                           "megatron's CUDA allocations to the CPU; use backend.device=cuda")
    # the modules the engine uses, loaded now so that all of them get the CPU view
    for name in ("megatron.core.distributed", "megatron.core.models.gpt",
                 "megatron.core.optimizer", "megatron.core.pipeline_parallel"):
        importlib.import_module(name)
    from megatron.core.tensor_parallel import random as mrandom

    if _CPU_TORCH is None:
        _CPU_TORCH = _CpuTorch()
    for name, module in list(sys.modules.items()):
        if (name == "megatron" or name.startswith("megatron.")) and \
                getattr(module, "torch", None) is torch:
            module.torch = _CPU_TORCH
    mrandom._CUDA_RNG_STATE_TRACKER = _NullRNGTracker()
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    from megatron.core.optimizer import clip_grads

    original = clip_grads.clip_grad_by_total_norm_fp32
    for name, module in list(sys.modules.items()):
        if name.startswith("megatron.") and \
                getattr(module, "clip_grad_by_total_norm_fp32", None) is original:
            module.clip_grad_by_total_norm_fp32 = _clip_grad_by_total_norm_cpu


def _clip_grad_by_total_norm_cpu(parameters: Any, max_norm: float, total_norm: float,
                                 use_decoupled_grad: bool = False) -> None:
    """megatron's ``clip_grad_by_total_norm_fp32`` without its assertion that every gradient
    is a ``torch.cuda.FloatTensor``: the same coefficient, max_norm / (norm + 1e-6), applied
    when below 1 (also ``torch.nn.utils.clip_grad_norm_``'s)."""
    coeff = max_norm / (total_norm + 1.0e-6)
    if coeff >= 1.0:
        return
    attr = "decoupled_grad" if use_decoupled_grad else "grad"
    for param in [parameters] if isinstance(parameters, torch.Tensor) else parameters:
        grad = getattr(param, attr, None)
        if grad is not None:
            grad.detach().mul_(coeff)
