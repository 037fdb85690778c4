"""Core value types that flow between tasks, backends and algorithms.

``Example`` is one problem, ``Score`` is a verifier's verdict on one response, ``SamplingParams``
says how to sample, and ``Trajectory`` is one sampled response, token-in/token-out: the ids the
rollout engine produced are the ids the trainer trains on, never re-tokenized. Likewise a
multimodal prompt's pixel inputs (``MultimodalPrompt.mm_inputs``) are computed once and carried
on the trajectory into training, never re-processed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: a verifier's or a judge's process need not load torch
    import torch


@dataclass
class Example:
    """One problem. ``prompt`` is text or a list of chat messages; ``answer``/``meta`` feed the
    verifier; ``images`` is for multimodal tasks. ``prompt_ids`` is set only on a prompt cut to
    the model's prompt limit (harness/prompts.py): the engines then use these ids as they are."""

    id: str
    prompt: str | list[dict[str, Any]]
    answer: Any = None
    meta: dict[str, Any] = field(default_factory=dict)
    images: list[Any] | None = None
    prompt_ids: list[int] | None = None


class MultimodalPrompt(list):
    """Prompt token ids (a ``list[int]``) that carry the pixel inputs of their images.

    ``mm_inputs`` are the tensors the model takes besides the ids (``pixel_values``, and
    ``image_grid_thw`` for Qwen2.5-VL), computed once by the engine's ``encode_prompt``;
    ``images`` are the raw images (what vLLM's ``multi_modal_data`` takes). Being a list, it
    travels through every caller that passes prompt ids to ``engine.generate`` unchanged;
    slicing or concatenating it gives a plain list (multi-turn prompts do not keep images).
    """

    def __init__(self, ids: list[int], mm_inputs: dict[str, torch.Tensor],
                 images: list[Any] | None = None) -> None:
        super().__init__(ids)
        self.mm_inputs = mm_inputs
        self.images = images or []


@dataclass
class Score:
    """A verifier's verdict. A parse failure (``parsed=False``: no answer could be extracted) is
    not the same as a wrong answer, and the trainer logs the rate of each."""

    reward: float
    correct: bool
    parsed: bool
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k filter
    max_new_tokens: int = 16
    entropy: bool = False  # also return the per-token entropy of the sampling distribution
    # entropy over the k most likely tokens only, -sum_{top k} p log p with p from the full
    # softmax (what vLLM's top-k logprobs give; ARPO's branching entropy); 0 = full vocabulary
    entropy_topk: int = 0
    stop: tuple[str, ...] = ()  # generation also stops once the response text ends with one


@dataclass
class Trajectory:
    """One sampled response.

    ``logprobs[t]`` is log pi_b(response_ids[t] | prefix) under the behaviour distribution
    (temperature-scaled logits, before top-p/top-k filtering). ``loss_mask`` is 0 on tokens the
    policy did not choose (tool outputs in agentic tasks). ``finish_reason`` is ``"stop"`` (EOS)
    or ``"length"`` (hit ``max_new_tokens``, i.e. truncated).
    ``prompt_ids`` is the prompt the trainer conditions on; a strategy that generates from a
    different prompt (LOPE's perturbed prompts) keeps that one in ``generation_prompt_ids``.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    loss_mask: list[int] | None = None
    finish_reason: str = "stop"
    stop_string: str | None = None  # the ``SamplingParams.stop`` string that ended it, if any
    text: str = ""
    group_id: int = 0
    example: Example | None = None
    score: Score | None = None
    turn_boundaries: list[int] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    # Set by rollout strategies that do not simply sample the training prompt: the temperature
    # the response was sampled at, whether it was drawn from another distribution than pi_old on
    # ``prompt_ids`` (``logprobs`` are then the behaviour log-probs and are never recomputed),
    # and the prompt it was generated from when that differs from the one it is trained on.
    temperature: float | None = None
    is_offpolicy: bool = False
    generation_prompt_ids: list[int] | None = None
    # branching strategies (ARPO/AEPO): the trajectory of the same group it was forked from
    # (index within the group) and how many response tokens it shares with it
    branch_parent: int | None = None
    branch_shared: int = 0
    # multimodal prompts: the pixel inputs the rollout engine prefilled with (the same tensor
    # objects, shared by the n samples of a prompt); training forwards reuse them as they are
    mm_inputs: dict[str, torch.Tensor] | None = None

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"
