"""megatron-core train engine: a ``GPTModel`` built from a Hugging Face checkpoint (GPU only).

The same ``TrainEngine`` surface as :class:`harness.backends.hf.HFEngine` (``forward``,
``logprobs``, ``backward``, ``optimizer_step``, ``save``/``load``), so the trainer and every
algorithm run unchanged; rollout comes from another engine (vLLM), which receives the weights
through :meth:`MegatronEngine.export_hf_weights` after each update.

* Model: ``TransformerConfig`` / ``GPTModel`` arguments from the HF config
  (:mod:`harness.backends.megatron_config`), weights converted by :mod:`harness.backends.convert`
  and sliced for this tensor-parallel rank. Padded vocabulary ids get -inf logits.
* Parallelism: tensor parallel (``backend.megatron.tensor_parallel_size``) and data parallel over
  the rest of the torchrun world, megatron's ``DistributedDataParallel`` and (optionally) the
  distributed optimizer. The trainer drives forward / backward one micro-batch at a time, which
  is exactly megatron's no-pipelining schedule; pipeline parallelism needs megatron's 1F1B
  schedule to own the micro-batch loop and is refused here.
* Log-probs: logits / T, then megatron's vocab-parallel cross entropy (autograd-correct across
  TP ranks). Entropy is computed with all-reduces outside the graph (a diagnostic); an entropy
  bonus (gradient through the entropy) is supported at TP = 1 only.
* Checkpoints: megatron ``dist_checkpointing`` (model + optimizer, reshardable), plus the
  weights in HF format on rank 0 so ``rlbench eval checkpoint=...`` loads them with ``hf``.
* ``backend.device=cpu``: megatron-core's CPU mode (:func:`harness.backends.distributed.
  enable_megatron_cpu`; gloo, fp32, the non-distributed optimizer), for tests and dry runs.
  On CPU it matches the transformers engine to ~1e-6 in log-probs, entropy and one AdamW step.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from harness.backends.convert import (
    arch_from_hf_config,
    hf_to_mcore,
    iter_mcore_to_hf,
    merge_tp,
    pad_vocab,
    split_tp,
    tp_kind,
)
from harness.backends.distributed import (
    enable_megatron_cpu,
    ensure_distributed,
    rank,
    require_cuda,
)
from harness.batch import RolloutBatch
from harness.engines import TrainEngine

MASKED_LOGIT = -1.0e30  # logit of padded vocabulary ids: exp() underflows to exactly 0


def vocab_parallel_logprobs(logits: torch.Tensor, labels: torch.Tensor, temperature: float,
                            vocab_size: int, vocab_start: int = 0) -> torch.Tensor:
    """log softmax(logits / T)[label] over a vocab-sharded last dim (this rank's shard starts at
    global id ``vocab_start``); ids >= ``vocab_size`` are padding and get no probability. The
    caller's ``logits`` are left intact (megatron's kernel works in place on its input)."""
    from megatron.core import tensor_parallel

    scaled = logits.float() / temperature  # a new tensor: the in-place kernel may clobber it
    ids = torch.arange(vocab_start, vocab_start + scaled.shape[-1], device=scaled.device)
    if bool((ids >= vocab_size).any()):
        scaled = scaled.masked_fill(ids >= vocab_size, MASKED_LOGIT)
    return -tensor_parallel.vocab_parallel_cross_entropy(scaled, labels)


@torch.no_grad()
def vocab_parallel_entropy(logits: torch.Tensor, temperature: float, vocab_size: int,
                           vocab_start: int, group: Any) -> torch.Tensor:
    """H(softmax(logits / T)) over a vocab-sharded last dim, without gradient."""
    import torch.distributed as dist

    scaled = logits.float() / temperature
    ids = torch.arange(vocab_start, vocab_start + scaled.shape[-1], device=scaled.device)
    scaled = scaled.masked_fill(ids >= vocab_size, MASKED_LOGIT)
    top = scaled.max(-1, keepdim=True).values
    dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
    shifted = scaled - top
    exp = shifted.exp()
    total = exp.sum(-1)
    weighted = (exp * shifted).sum(-1)
    dist.all_reduce(total, group=group)
    dist.all_reduce(weighted, group=group)
    return total.log() - weighted / total


def causal_padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Megatron's bool mask [B, 1, S, S], True = masked: causal, and no attention to padding.
    A query row that is itself padding keeps its diagonal, so its softmax stays finite."""
    S = attention_mask.shape[1]
    causal = torch.ones(S, S, dtype=torch.bool, device=attention_mask.device).tril()
    allowed = causal[None] & attention_mask.bool()[:, None, :]
    allowed |= torch.eye(S, dtype=torch.bool, device=attention_mask.device)[None]
    return ~allowed[:, None]


def check_device(backend_cfg: Any) -> bool:
    """True for megatron's CPU mode (``backend.device=cpu``), after refusing what it cannot do;
    otherwise require a GPU. Runs before megatron-core is imported."""
    from harness.typed_config import ConfigError

    if str(getattr(backend_cfg, "device", "cuda")) != "cpu":
        try:
            require_cuda("megatron")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; or backend.device=cpu backend.dtype=float32 "
                               "backend.megatron.use_distributed_optimizer=false (megatron's "
                               "CPU mode, for tests)") from None
        return False
    if backend_cfg.dtype != "float32":
        raise ConfigError(f"backend.dtype={backend_cfg.dtype} with backend.device=cpu: "
                          "megatron-core's bf16/fp16 (Float16Module) needs CUDA; use "
                          "backend.dtype=float32")
    if backend_cfg.megatron.use_distributed_optimizer:
        raise ConfigError("backend.megatron.use_distributed_optimizer=true with "
                          "backend.device=cpu: megatron-core's distributed optimizer needs CUDA; "
                          "set it to false")
    enable_megatron_cpu()
    return True


class MegatronEngine(TrainEngine):
    """``TrainEngine`` over megatron-core (tensor + data parallel, bf16, distributed optimizer;
    fp32 on CPU with ``backend.device=cpu``)."""

    requires_cuda = True
    cpu_mode = True  # backend.device=cpu runs megatron-core on CPU (fp32; tests, dry runs)

    def __init__(self, model_path: str, backend_cfg: Any, seed: int, optim_cfg: Any | None = None,
                 total_steps: int = 1, need_reference: bool = False,
                 attn_implementation: str | None = None) -> None:
        self.on_cpu = check_device(backend_cfg)
        from megatron.core import parallel_state as ps
        from megatron.core import tensor_parallel
        from transformers import AutoConfig

        from harness.models.tiny import load_tokenizer

        mcfg = backend_cfg.megatron
        if mcfg.pipeline_parallel_size != 1:
            raise NotImplementedError(
                "backend.megatron.pipeline_parallel_size > 1: the trainer drives one micro-batch "
                "at a time (megatron's no-pipelining schedule); use tensor + data parallel")
        ensure_distributed("cpu" if self.on_cpu else "cuda")
        if not ps.model_parallel_is_initialized():
            ps.initialize_model_parallel(tensor_model_parallel_size=mcfg.tensor_parallel_size,
                                         pipeline_model_parallel_size=1)
        if self.on_cpu:
            self.device = torch.device("cpu")
        else:
            tensor_parallel.model_parallel_cuda_manual_seed(seed)
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.tp = ps.get_tensor_model_parallel_world_size()
        self.tp_rank = ps.get_tensor_model_parallel_rank()
        self.tp_group = ps.get_tensor_model_parallel_group()
        self.dtype = getattr(torch, backend_cfg.dtype)
        self.model_path, self.mcfg = model_path, mcfg
        self.hf_config = AutoConfig.from_pretrained(model_path)
        self.spec = arch_from_hf_config(self.hf_config)
        self.tokenizer = load_tokenizer(model_path)
        self.pad_token_id = (self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None
                             else self.tokenizer.eos_token_id)
        # self.gpt: the GPTModel (names, weights in and out); self.module: what runs, wrapped in
        # megatron's Float16Module under bf16/fp16 (casts inputs in and logits out). On CPU the
        # random init draws from the CPU generator: fork it, so that building the engine leaves
        # the trainer's random streams where they were (as on a GPU)
        with torch.random.fork_rng(devices=[]):
            self.gpt, self.module = self._build_module()
            self._load_hf(self.gpt)
            self.ref_model = None
            if need_reference:
                ref_gpt, self.ref_model = self._build_module()
                ref_gpt.load_state_dict(self.gpt.state_dict())
                self.ref_model.eval().requires_grad_(False)
        self.model = self.module
        self.optimizer = None
        self.opt_steps = 0
        if optim_cfg is not None:
            self._build_optimizer(optim_cfg, total_steps)

    # -- model ----------------------------------------------------------------------------------
    def _build_module(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        from megatron.core.models.gpt import GPTModel
        from megatron.core.transformer.module import Float16Module

        from harness.backends import megatron_config as mc

        config = mc.build_transformer_config(
            self.hf_config, tp=self.tp, dtype=self.dtype,
            sequence_parallel=self.mcfg.sequence_parallel,
            recompute_granularity=self.mcfg.recompute_granularity, cpu_init=self.on_cpu)
        kwargs = mc.gpt_model_kwargs(self.hf_config, tp=self.tp)
        self.vocab_padded = kwargs["vocab_size"]
        model = GPTModel(config=config,
                         transformer_layer_spec=mc.layer_spec(self.hf_config,
                                                              self.mcfg.transformer_impl),
                         **kwargs).to(self.device)
        wrapped = Float16Module(config, model) if config.bf16 or config.fp16 else model
        return model, wrapped

    @torch.no_grad()
    def _load_hf(self, module: torch.nn.Module) -> None:
        """HF checkpoint -> Megatron names -> this TP rank's shard, copied into ``module``."""
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=self.dtype)
        full = hf_to_mcore(hf.state_dict(), self.spec,
                           te=self.mcfg.transformer_impl == "transformer_engine")
        del hf
        own = module.state_dict()
        for name, target in own.items():
            if name.endswith("_extra_state"):
                continue
            tensor = full[name]
            if tp_kind(name) == "vocab":
                tensor = pad_vocab(tensor, self.vocab_padded)
            target.copy_(split_tp(name, tensor, self.tp)[self.tp_rank])

    def _build_optimizer(self, cfg: Any, total_steps: int) -> None:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        distributed = bool(self.mcfg.use_distributed_optimizer)
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=self.mcfg.grad_reduce_in_fp32, overlap_grad_reduce=False,
            use_distributed_optimizer=distributed)
        self.model = DistributedDataParallel(self.module.config, ddp_config, self.module)
        half = self.dtype in (torch.bfloat16, torch.float16)
        opt_config = OptimizerConfig(
            optimizer="adam", lr=cfg.lr, weight_decay=cfg.weight_decay, adam_beta1=cfg.betas[0],
            adam_beta2=cfg.betas[1], adam_eps=cfg.eps, clip_grad=cfg.grad_clip,
            bf16=self.dtype == torch.bfloat16, fp16=self.dtype == torch.float16,
            params_dtype=self.dtype if half else torch.float32,
            use_distributed_optimizer=distributed)
        self.optimizer = get_megatron_optimizer(opt_config, [self.model])
        if self.on_cpu:
            enable_megatron_cpu()  # modules the optimizer imported lazily get the CPU view too
        self.base_lr, self.warmup, self.schedule = cfg.lr, cfg.warmup_steps, cfg.schedule
        self.total_steps = total_steps
        self._set_lr()

    def _lr_at(self, step: int) -> float:  # the same schedule as the hf engine
        if self.warmup > 0 and step < self.warmup:
            return self.base_lr * (step + 1) / self.warmup
        frac = min((step - self.warmup) / max(self.total_steps - self.warmup, 1), 1.0)
        if self.schedule == "cosine":
            return self.base_lr * 0.5 * (1 + math.cos(math.pi * frac))
        if self.schedule == "linear":
            return self.base_lr * max(0.0, 1.0 - frac)
        return self.base_lr

    def _set_lr(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self._lr_at(self.opt_steps)

    # -- training -------------------------------------------------------------------------------
    def forward(self, mb: RolloutBatch, temperature: float, with_entropy: bool = True,
                entropy_grad: bool = False, model: torch.nn.Module | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log pi_theta and entropy [B, T] on the response tokens of ``mb``."""
        mb.require("input_ids", "attention_mask", "position_ids", "responses", stage="forward")
        model = model or self.model
        ids = mb["input_ids"].to(self.device)
        attn = mb["attention_mask"].to(self.device)
        responses = mb["responses"].to(self.device)
        T = responses.shape[1]
        logits = model(input_ids=ids, position_ids=mb["position_ids"].to(self.device),
                       attention_mask=causal_padding_mask(attn))
        logits = logits[:, -T - 1:-1]  # position p predicts token p + 1
        start = self.tp_rank * logits.shape[-1]
        logp = vocab_parallel_logprobs(logits, responses, temperature, self.spec.vocab_size,
                                       start)
        entropy = None
        if with_entropy:
            if entropy_grad:
                if self.tp != 1:
                    raise NotImplementedError("an entropy bonus under tensor parallel > 1")
                lp = torch.log_softmax(logits[..., : self.spec.vocab_size].float() / temperature,
                                       -1)
                entropy = -(lp.exp() * lp).sum(-1)
            else:
                entropy = vocab_parallel_entropy(logits, temperature, self.spec.vocab_size, start,
                                                 self.tp_group)
        return logp, entropy

    @torch.no_grad()
    def logprobs(self, batch: RolloutBatch, temperature: float, micro_batch_size: int,
                 reference: bool = False) -> torch.Tensor:
        model = self.ref_model if reference else self.model
        if model is None:
            raise RuntimeError("reference log-probs requested but no reference model was kept")
        parts = [self.forward(mb, temperature, with_entropy=False, model=model)[0].cpu()
                 for mb in batch.split(micro_batch_size)]
        return torch.cat(parts)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()  # megatron's DDP hooks accumulate into its contiguous grad buffers

    def optimizer_step(self) -> float:
        """All-reduce gradients over data parallel, clip, step; the pre-clip gradient norm."""
        from megatron.core.distributed import finalize_model_grads

        finalize_model_grads([self.model])
        self._set_lr()
        ok, grad_norm, _ = self.optimizer.step()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        self.opt_steps += 1
        return float(grad_norm) if ok and grad_norm is not None else float("nan")

    @property
    def lr(self) -> float:
        return self._lr_at(self.opt_steps) if self.optimizer is not None else 0.0

    def train_mode(self, on: bool) -> None:
        self.model.train(on)

    # -- weights out: vLLM sync and export ------------------------------------------------------
    @torch.no_grad()
    def export_hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, full tensor) pairs, one parameter at a time: TP shards are gathered and the
        fused layouts split. Every TP rank yields the same full tensors (vLLM slices itself)."""
        import torch.distributed as dist

        def gathered() -> Iterator[tuple[str, torch.Tensor]]:
            for name, shard in self.gpt.state_dict().items():
                if name.endswith("_extra_state"):
                    continue
                if self.tp == 1 or tp_kind(name) == "replicated":
                    yield name, shard
                    continue
                parts = [torch.empty_like(shard) for _ in range(self.tp)]
                dist.all_gather(parts, shard.contiguous(), group=self.tp_group)
                yield name, merge_tp(name, parts)

        yield from iter_mcore_to_hf(gathered(), self.spec)

    # -- checkpoints ----------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        import torch.distributed as dist
        from megatron.core import dist_checkpointing

        path = Path(path)
        state = {"model": self.gpt.sharded_state_dict()}
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.sharded_state_dict(state["model"])
        (path / "megatron").mkdir(parents=True, exist_ok=True)
        dist_checkpointing.save(state, str(path / "megatron"))
        weights = dict(self.export_hf_weights())  # every rank joins the TP all-gathers
        if rank() == 0:
            self._save_hf(path, weights)
            torch.save({"opt_steps": self.opt_steps}, path / "engine_state.pt")
        dist.barrier()

    def _save_hf(self, path: Path, weights: dict[str, torch.Tensor]) -> None:
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            hf = AutoModelForCausalLM.from_config(self.hf_config)
        hf.load_state_dict({k: v.cpu() for k, v in weights.items()}, strict=False, assign=True)
        hf.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    def load(self, path: str | Path) -> None:
        from megatron.core import dist_checkpointing

        path = Path(path)
        state = {"model": self.gpt.sharded_state_dict()}
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.sharded_state_dict(state["model"],
                                                                   is_loading=True)
        loaded = dist_checkpointing.load(state, str(path / "megatron"))
        self.gpt.load_state_dict(loaded["model"])
        if self.optimizer is not None and "optimizer" in loaded:
            self.optimizer.load_state_dict(loaded["optimizer"])
        extra = torch.load(path / "engine_state.pt", weights_only=False)
        self.opt_steps = extra["opt_steps"]
