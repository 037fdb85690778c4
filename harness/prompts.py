"""Prompts that fit the model: lengths, truncation, chat templates and token ids, checked once
before anything trains or evaluates.

Every prompt of the train pool and of each eval set is encoded by the rollout engine (its chat
template applied), and must fit the model:

* **Length.** With ``C`` the model's context (``max_position_embeddings`` of its config, GPT-2's
  ``n_positions``; else the tokenizer's ``model_max_length``) and ``R`` the most tokens a
  response may take (``rollout.max_new_tokens``, or an eval set's own ``max_new_tokens``; for a
  multi-turn task ``max_total_tokens`` plus that, since a segment is sampled in full before it is
  cut to ``max_total_tokens``), a prompt may take ``L = data.max_prompt_length`` tokens,
  or ``C - R`` when that is null; ``L + R > C`` is refused. So prompt plus response never
  exceeds the context, in rollout or in training. A longer prompt is handled by
  ``data.filter_overlong_prompts=true`` (dropped) or else ``data.truncation``: ``error`` (the
  default: refused, naming the row, its length and the limit), ``left`` (keep the last ``L``
  tokens, TRL's choice), ``right`` (the first ``L``) or ``middle`` (the first ``L // 2`` and the
  last ``L - L // 2``). One line says how many prompts of each set were dropped or cut; the
  counts are logged (``data/<set>/prompts_dropped``, ``prompts_truncated``, ``prompts``).
  These are verl's ``data.max_prompt_length``, ``data.truncation`` and
  ``data.filter_overlong_prompts``; verl's ``data.max_response_length`` is rlbench's
  ``rollout.max_new_tokens``.
* **Chat prompts** (a list of messages) need a chat template: the tokenizer's own, or
  ``model.chat_template``; without one they are refused naming both fixes.
* **Token ids** must be rows of the model's input embedding: a tokenizer with tokens the model
  lacks (added tokens, embeddings never resized) is refused naming the id.
* **EOS and pad.** No EOS token at all (tokenizer, ``generation_config.json``) is refused: a
  response could never end. No pad token: EOS pads, with a warning (what transformers does).

A cut prompt keeps its ids on the example (``Example.prompt_ids``), which the engines use
instead of encoding it again. Prompts with images are never cut (their image tokens would be):
filter them, or raise the limit.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from harness.task import EvalSet, Task
from harness.typed_config import ConfigError
from harness.types import Example

log = logging.getLogger("rlbench")

# a tokenizer's model_max_length above this is transformers' "no limit" sentinel
NO_LIMIT = 10**8


@dataclass
class ModelLimits:
    context: int | None  # positions the model takes; None: unknown
    context_source: str
    vocab: int | None  # rows of the input embedding
    path: str


def model_limits(model_path: str, tokenizer: Any) -> ModelLimits:
    """The model's context and embedding size, from its config (not its weights)."""
    from transformers import AutoConfig

    import harness.models.tiny_vlm  # noqa: F401  registers the tiny VLM's config

    config = AutoConfig.from_pretrained(model_path)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    context, source = None, ""
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(text, key, None)
        if isinstance(value, int) and value > 0:
            context, source = value, f"{key} of {model_path}"
            break
    limit = getattr(tokenizer, "model_max_length", None)
    if context is None and isinstance(limit, int) and 0 < limit < NO_LIMIT:
        context, source = limit, f"the tokenizer's model_max_length ({model_path})"
    vocab = getattr(text, "vocab_size", None)
    return ModelLimits(context, source, vocab if isinstance(vocab, int) else None, model_path)


def check_special_tokens(engine: Any, limits: ModelLimits) -> None:
    """EOS must exist (refused otherwise); a missing pad token is EOS (warned); both must be
    ids the embedding takes."""
    tok = engine.tokenizer
    if not engine.eos_token_ids:
        raise ConfigError(
            f"the tokenizer of {limits.path} has no EOS token (tokenizer_config.json "
            "\"eos_token\", generation_config.json \"eos_token_id\"): a response could never "
            "end; give the model directory one of them")
    if tok.pad_token_id is None:
        log.warning("the tokenizer of %s has no pad token: padding with EOS (%r, id %s), as "
                    "transformers does", limits.path, tok.eos_token, engine.pad_token_id)
    for name, ids in (("EOS", engine.eos_token_ids), ("pad", [engine.pad_token_id])):
        bad = [i for i in ids if limits.vocab is not None and i is not None and i >= limits.vocab]
        if bad:
            raise ConfigError(
                f"the {name} token id {bad[0]} of {limits.path}'s tokenizer is not a row of the "
                f"model's embedding ({limits.vocab} rows): {_VOCAB_FIX}")


_VOCAB_FIX = ("the tokenizer has tokens the model lacks; resize the embeddings "
              "(model.resize_token_embeddings(len(tokenizer))) and save the model, or use the "
              "model's own tokenizer")


def prompt_limit(limits: ModelLimits, max_prompt: int | None, response: int,
                 response_key: str) -> int | None:
    """The most tokens a prompt may take when responses take up to ``response`` tokens."""
    ctx = limits.context
    if ctx is None:
        return max_prompt
    if response >= ctx:
        raise ConfigError(
            f"{response_key}={response} leaves no room for a prompt: the model's context is "
            f"{ctx} tokens ({limits.context_source}); set {response_key} below {ctx}")
    room = ctx - response
    if max_prompt is None:
        return room
    if max_prompt > room:
        raise ConfigError(
            f"data.max_prompt_length={max_prompt} plus {response_key}={response} is "
            f"{max_prompt + response} tokens, over the model's context of {ctx} "
            f"({limits.context_source}): lower one of them (data.max_prompt_length <= {room})")
    return max_prompt


def cut(ids: list[int], limit: int, side: str) -> list[int]:
    """``ids`` cut to ``limit`` tokens, keeping the end (left), the start (right) or both."""
    if side == "left":
        return list(ids[len(ids) - limit:])
    if side == "right":
        return list(ids[:limit])
    head = limit // 2
    return list(ids[:head]) + list(ids[len(ids) - (limit - head):])


def fit_examples(examples: list[Example], engine: Any, limits: ModelLimits, limit: int | None,
                 data: Any, where: str, why: str) -> tuple[list[Example], dict[str, float]]:
    """``examples`` that fit (dropped or cut as ``data`` says), and the counts."""
    chat_ok = getattr(engine.tokenizer, "chat_template", None) is not None
    kept: list[Example] = []
    over: list[tuple[int, Example, int]] = []
    truncated = 0
    for i, ex in enumerate(examples):
        row = ex.meta.get("index", i) if isinstance(ex.meta, dict) else i
        name = f"{where} row {row} (id {ex.id!r})"
        if isinstance(ex.prompt, list) and not ex.images and not chat_ok:
            raise ConfigError(
                f"{name} is a chat prompt (a list of messages), but the tokenizer of "
                f"{limits.path} has no chat template: set model.chat_template='<a Jinja chat "
                "template>', or give text prompts (a text prompt column, task.chat=false)")
        try:
            ids = engine.encode_prompt(ex)
        except Exception as exc:
            raise ConfigError(f"{name}: the tokenizer cannot encode its prompt "
                              f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
                              ) from None
        if limits.vocab is not None and ids and max(ids) >= limits.vocab:
            raise ConfigError(f"{name} encodes to token id {max(ids)}, which the model's "
                              f"embedding ({limits.vocab} rows) cannot take: {_VOCAB_FIX}")
        if limit is None or len(ids) <= limit:
            kept.append(ex)
            continue
        over.append((row, ex, len(ids)))
        if data.filter_overlong_prompts or data.truncation == "error":
            continue  # dropped, or refused below naming the first
        if ex.images:
            raise ConfigError(f"{name} is {len(ids)} tokens with its images, over the prompt "
                              f"limit of {limit} ({why}); a prompt with images cannot be cut: "
                              "data.filter_overlong_prompts=true drops it")
        kept.append(dataclasses.replace(ex, prompt_ids=cut(ids, limit, data.truncation)))
        truncated += 1
    if over and not data.filter_overlong_prompts and data.truncation == "error":
        row, ex, n = over[0]
        more = f" (and {len(over) - 1} more)" if len(over) > 1 else ""
        raise ConfigError(
            f"{where} row {row} (id {ex.id!r}) is {n} tokens, over the prompt limit of {limit} "
            f"({why}){more}: cut prompts with data.truncation=left|right|middle, drop them with "
            "data.filter_overlong_prompts=true, or allow longer prompts (a shorter "
            "rollout.max_new_tokens, data.max_prompt_length)")
    if not examples:
        raise ConfigError(f"{where} has no prompts")
    if not kept:
        raise ConfigError(f"every prompt of {where} is over the prompt limit of {limit} ({why}) "
                          "and data.filter_overlong_prompts=true drops them all")
    if over:
        action = "dropped" if data.filter_overlong_prompts else f"cut ({data.truncation})"
        log.warning("%s: %d of %d prompts are over the prompt limit of %d tokens (%s): %s",
                    where, len(over), len(examples), limit, why, action)
    dropped = len(examples) - len(kept)
    return kept, {"prompts": float(len(kept)), "prompts_dropped": float(dropped),
                  "prompts_truncated": float(truncated)}


@dataclass
class FittedData:
    train: list[Example]
    eval_sets: list[EvalSet]
    metrics: dict[str, float]  # data/<set>/prompts, prompts_dropped, prompts_truncated


def fit_data(cfg: Any, engine: Any, model_path: str, task: Task, train: bool = True,
             evals: bool = True) -> FittedData:
    """The train pool (when ``train``) and every eval set of ``task`` (when ``evals``: a run
    that never evaluates leaves them unread), fitted to the model."""
    data = cfg.data
    limits = model_limits(model_path, engine.tokenizer)
    check_special_tokens(engine, limits)
    metrics: dict[str, float] = {}

    def fit(examples: list[Example], name: str, where: str, response: int, key: str
            ) -> list[Example]:
        limit = prompt_limit(limits, data.max_prompt_length, response, key)
        why = ("data.max_prompt_length" if data.max_prompt_length is not None else
               f"context {limits.context} ({limits.context_source}) - {key} {response}")
        kept, counts = fit_examples(examples, engine, limits, limit, data, where, why)
        metrics.update({f"data/{name}/{k}": v for k, v in counts.items()})
        return kept

    env = task.tool_env()

    def response(max_new: int, key: str) -> tuple[int, str]:
        if env is None:
            return max_new, key
        # multi-turn: a segment of up to max_new tokens is sampled after as many as
        # max_total - 1 response tokens before it is cut to max_total (harness/multiturn.py)
        total = int(env.max_total_tokens)
        return total + min(max_new, total), f"the task's max_total_tokens + {key}"

    pool: list[Example] = []
    if train:
        pool = fit(task.train_examples(), "train", "task.train",
                   *response(int(cfg.rollout.max_new_tokens), "rollout.max_new_tokens"))
    sets = []
    for es in task.eval_sets() if evals else []:
        length, key = response(int(es.protocol.max_new_tokens),
                               f"the max_new_tokens of eval set {es.name!r}")
        sets.append(dataclasses.replace(
            es, examples=fit(es.examples, es.name, f"eval set {es.name!r}", length, key)))
    return FittedData(pool, sets, metrics)
