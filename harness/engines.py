"""The two engine contracts: a rollout engine samples, a train engine scores and updates.

A backend is a class registered with ``@register_backend(name)`` (``backend.rollout`` and
``backend.train`` name one each; the same name means one object plays both roles and shares its
weights). It subclasses the protocol(s) it implements, so its optional capabilities are declared
class attributes with the defaults below rather than probed at run time:

==================== ======= ===================================================================
capability           default meaning
==================== ======= ===================================================================
``receives_weights`` False   ``update_weights`` really copies a train engine's weights, so this
                             engine may serve rollouts for a different train engine
``requires_cuda``    False   refuses to start without a visible CUDA device ...
``cpu_mode``         False   ... unless ``backend.device=cpu`` and this is True (megatron-core)
``can_forward``      False   the rollout engine can also score (``forward``), so a strategy may
                             compute the full-vocabulary entropy on it (ARPO's branching); False:
                             the trainer recomputes it with the train engine
``gen_batch_size``   0       prompts x samples per ``generate`` call; 0 = all at once
``vocab_size``       0       V of the sampling distribution (ARPO normalises entropy by ln V);
                             0 = unknown
``sleep()``          no-op   called when the rollout phase of a step ends with separate engines:
                             hand the accelerator memory to training (vLLM's sleep mode)
==================== ======= ===================================================================

Built-in engines: :class:`harness.backends.hf.HFEngine` (both roles, CPU or GPU),
:class:`harness.backends.vllm_engine.VLLMEngine` (rollout, GPU) and
:class:`harness.backends.megatron_engine.MegatronEngine` (train, GPU; CPU for tests).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch

from harness.batch import RolloutBatch
from harness.types import Example, SamplingParams, Trajectory


class TrainEngine(Protocol):
    """Scores and updates the policy pi_theta (and holds the reference policy when asked)."""

    requires_cuda: ClassVar[bool] = False
    cpu_mode: ClassVar[bool] = False
    tokenizer: Any
    lr: float  # the optimizer's current learning rate (logged as actor/lr)

    def forward(self, mb: RolloutBatch, temperature: float, with_entropy: bool = True,
                entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log pi_theta of each response token [B, T] at ``temperature`` (with grad), and the
        full-vocabulary entropy [B, T] when ``with_entropy`` (with grad iff ``entropy_grad``)."""
        ...

    def logprobs(self, batch: RolloutBatch, temperature: float, micro_batch_size: int,
                 reference: bool = False) -> torch.Tensor:
        """No-grad log-probs [B, T] of ``batch``'s responses under pi_theta (or pi_ref)."""
        ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def optimizer_step(self) -> float:
        """Clip, step and zero the gradients; returns the gradient norm before clipping."""
        ...

    def train_mode(self, on: bool) -> None: ...

    def save(self, path: str | Path) -> None:
        """Weights, optimizer and scheduler state into the checkpoint directory ``path``."""
        ...

    def load(self, path: str | Path) -> None: ...


class RolloutEngine(Protocol):
    """Samples responses from the current policy and turns prompts into token ids."""

    receives_weights: ClassVar[bool] = False
    requires_cuda: ClassVar[bool] = False
    cpu_mode: ClassVar[bool] = False
    can_forward: ClassVar[bool] = False
    gen_batch_size: int = 0
    vocab_size: int = 0  # V of the sampling distribution (ARPO's ln V); 0 = unknown
    pad_token_id: int
    eos_token_ids: list[int]
    tokenizer: Any  # a transformers tokenizer (its chat template renders chat prompts)

    def encode_prompt(self, example: Example) -> list[int]:
        """Prompt token ids. For an example with images: a ``MultimodalPrompt`` (still a
        ``list[int]``) carrying the pixel inputs, which ``generate`` must sample with (hf:
        ``pixel_values`` in the prefill; vLLM: ``multi_modal_data``) and put on each
        trajectory's ``mm_inputs`` for the train engine (docs/multimodal.md)."""
        ...

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 generator: torch.Generator | None = None) -> list[Trajectory]:
        """``params.n`` samples for each prompt, prompt-major order, ``text`` decoded."""
        ...

    def decode(self, ids: list[int]) -> str: ...

    def encode_text(self, text: str) -> list[int]: ...

    def update_weights(self, train_engine: TrainEngine) -> None:
        """Take the train engine's current weights (a no-op when both roles are one object)."""
        ...

    def sleep(self) -> None:
        """Free accelerator memory until the next ``update_weights`` or ``generate``."""
        return None


def build_engines(cfg: Any, model_path: Path, need_reference: bool
                  ) -> tuple[TrainEngine, RolloutEngine]:
    """The cell's train engine and the rollout engine that samples for it (the same object when
    ``backend.rollout == backend.train``). With separate engines the rollout engine starts first
    (vLLM sizes its memory from what is free when it starts) and is refused unless it can take
    the train engine's weights; it then starts from them. ``model.chat_template`` replaces the
    tokenizer's on both."""
    from harness.registry import BACKENDS
    from harness.typed_config import ConfigError

    rollout: RolloutEngine | None = None
    if cfg.backend.rollout != cfg.backend.train:
        rollout_cls = BACKENDS.get(cfg.backend.rollout)
        if not rollout_cls.receives_weights:
            raise ConfigError(
                f"backend.rollout={cfg.backend.rollout!r} cannot take weights from "
                f"backend.train={cfg.backend.train!r}; use the same engine for both")
        rollout = rollout_cls(model_path, cfg.backend, cfg.seed)
    train = BACKENDS.get(cfg.backend.train)(
        model_path, cfg.backend, cfg.seed, cfg.trainer.optim, total_steps=cfg.trainer.steps,
        need_reference=need_reference, attn_implementation=cfg.model.attn_implementation)
    if rollout is None:
        rollout = train
    else:
        rollout.update_weights(train)  # it starts without real weights
    if cfg.model.chat_template:
        for engine in {id(train): train, id(rollout): rollout}.values():
            engine.tokenizer.chat_template = cfg.model.chat_template
    return train, rollout
