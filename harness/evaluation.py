"""Evaluation: sample ``n`` responses per held-out problem and report pass@k, mean@n, maj@k.

pass@k is the unbiased estimator of Chen et al. (2021, "Codex"): with ``c`` correct among ``n``
samples, pass@k = 1 - C(n-c, k) / C(n, k), averaged over problems. mean@n is the mean reward over
all samples (for 0/1 rewards it equals pass@1). maj@k (majority vote over the first k answers)
is reported only when the task's scores carry an ``answer_key`` in ``Score.info`` (for each k of
the protocol's ``maj_k``, default its ``k``). A task may also put numeric per-sample statistics in
``Score.info["stats"]`` (e.g. which answer-extraction method fired, grading timeouts); each is
logged as its mean over the set, ``eval/<set>/<stat>``. Metric names use ``_at_`` because MLflow
rejects ``@``: ``eval/<set>/pass_at_<k>``.

Beside every pass@k, two standard errors say how much of a score is measurement:

* ``eval/<set>/pass_at_<k>_stderr``: the problem-level standard error, sd over problems of the
  per-problem estimate / sqrt(P) (as lm-evaluation-harness reports ``acc_stderr``): how far the
  score could move on another draw of P problems from the same distribution.
* ``eval/<set>/pass_at_1_sampling_se``: the sampling noise of re-evaluating the same model on the
  same P problems, sqrt(sum_i p_i (1 - p_i) / (n - 1)) / P with p_i = c_i / n (the unbiased
  estimate of Var(c_i / n) = p_i (1 - p_i) / n). Every seed of a board is evaluated on the same
  problems, so this, not the problem-level error, is the evaluation noise inside a board's seed
  variance.

The per-problem counts themselves (problem id, n, c) are returned for the caller to log (the
trainer writes them as the MLflow artifact ``evals/step_<step>.jsonl``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from harness.multiturn import generate_multiturn
from harness.progress import Progress
from harness.task import EvalSet, Task
from harness.typed_config import ConfigError
from harness.types import SamplingParams


def at_marks(marks: Sequence[float], before: float, after: float) -> tuple[bool, bool]:
    """Equal-compute evaluations (``trainer.eval_at_tokens``): for each declared mark ``m`` of
    tokens generated, the policy is evaluated once where the run's token count is nearest ``m``.
    The count is known only after a step's rollouts: when they take it from ``before`` (T_{s-1})
    < m to ``after`` (T_s) >= m, the policy trained on T_{s-1} tokens (the one that just
    generated them) is evaluated before the step's update if m - T_{s-1} <= T_s - m, else the
    updated one after it. Returns (evaluate now, evaluate after the update). A board reads each
    row's equal-compute score from that evaluation (within half a step's tokens of the mark),
    never from interpolating between two; evaluation draws from its own generator
    (:func:`evaluate`), so the extra evaluations leave training bit-identical."""
    crossed = [m for m in marks if before < m <= after]
    return (any(m - before <= after - m for m in crossed),
            any(m - before > after - m for m in crossed))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem (numerically stable product form)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def majority_correct(keys: list[Any], correct: list[bool]) -> bool:
    """Is the most frequent answer key (ties broken by first occurrence) a correct one?"""
    counts = Counter(k for k in keys if k is not None)
    if not counts:
        return False
    top = max(counts.values())
    winner = next(k for k in keys if k is not None and counts[k] == top)
    return any(c for k, c in zip(keys, correct) if k == winner)


def check_eval_sets(task: Task) -> None:
    """An eval set without problems has no pass@k (the mean of nothing): refuse it up front."""
    for eval_set in task.eval_sets():
        if not eval_set.examples:
            raise ConfigError(
                f"eval set {eval_set.name!r} of task={task.name} has no problems (an empty file, "
                f"or limit=0?): give it data, or drop it (~task.<section>.eval.{eval_set.name})")


def evaluate_set(
    engine: Any, task: Task, eval_set: EvalSet, generator: torch.Generator,
    samples_to_keep: int = 0, progress: Progress | None = None,
) -> tuple[dict[str, float], list[dict[str, Any]], list[dict[str, Any]]]:
    """Metrics, the first ``samples_to_keep`` problems' first samples, and per problem
    ``{eval_set, example_id, n, correct}`` (c of the n samples correct)."""
    proto = eval_set.protocol
    examples = eval_set.examples
    params = SamplingParams(n=proto.n, temperature=proto.temperature, top_p=proto.top_p,
                            max_new_tokens=proto.max_new_tokens)
    start = time.perf_counter()
    env = task.tool_env()
    if env is not None:  # multi-turn: the same tool loop as training rollouts
        trajs = generate_multiturn(engine, examples, params, env, generator=generator)
        if progress is not None:
            progress.update(len(examples))
    else:
        prompt_ids = [engine.encode_prompt(ex) for ex in examples]
        # in the engine's own generation batches (so the samples are those of one call), each
        # one a step of the progress display
        size = engine.gen_batch_size
        step = max(1, size // proto.n) if size > 0 else max(1, len(prompt_ids))
        trajs = []
        for first in range(0, len(prompt_ids), step):
            trajs += engine.generate(prompt_ids[first : first + step], params,
                                     generator=generator)
            if progress is not None:
                progress.update(len(prompt_ids[first : first + step]))
    owners = [examples[i // proto.n] for i in range(len(trajs))]
    scores = task.verify_batch(owners, [t.text for t in trajs])
    n = proto.n
    correct = np.array([s.correct for s in scores], dtype=bool).reshape(len(examples), n)
    rewards = np.array([s.reward for s in scores], dtype=float)
    name = eval_set.name
    metrics: dict[str, float] = {}
    per_problem_c = correct.sum(1)
    for k in proto.k:
        per_problem = np.array([pass_at_k(n, int(c), k) for c in per_problem_c])
        metrics[f"eval/{name}/pass_at_{k}"] = float(per_problem.mean())
        metrics[f"eval/{name}/pass_at_{k}_stderr"] = (
            float(per_problem.std(ddof=1) / np.sqrt(per_problem.size))
            if per_problem.size > 1 else float("nan"))
    if n > 1:
        p_i = per_problem_c / n
        metrics[f"eval/{name}/pass_at_1_sampling_se"] = float(
            np.sqrt(np.sum(p_i * (1.0 - p_i) / (n - 1))) / len(examples))
    metrics[f"eval/{name}/mean_at_{n}"] = float(rewards.mean())
    metrics[f"eval/{name}/parse_fail_rate"] = float(np.mean([not s.parsed for s in scores]))
    metrics[f"eval/{name}/response_len"] = float(np.mean([len(t.response_ids) for t in trajs]))
    keys = [s.info.get("answer_key") for s in scores]
    if any(k is not None for k in keys):
        for k in proto.k if proto.maj_k is None else proto.maj_k:
            votes = [
                majority_correct(keys[i * n : i * n + k], correct[i, :k].tolist())
                for i in range(len(examples))
            ]
            metrics[f"eval/{name}/maj_at_{k}"] = float(np.mean(votes))
    for stat in sorted({k for s in scores for k in s.info.get("stats", {})}):
        metrics[f"eval/{name}/{stat}"] = float(
            np.mean([float(s.info.get("stats", {}).get(stat, 0.0)) for s in scores]))
    if env is not None:
        metrics[f"eval/{name}/tool_calls_per_traj"] = float(
            np.mean([len(t.tool_calls) for t in trajs]))
    metrics[f"eval/{name}/samples"] = float(len(trajs))
    metrics[f"time/eval_{name}"] = time.perf_counter() - start
    kept = [
        {
            "eval_set": name,
            "example_id": owners[i].id,
            "prompt": owners[i].prompt,
            "response": trajs[i].text,
            "reward": scores[i].reward,
            "correct": scores[i].correct,
            "parsed": scores[i].parsed,
            "finish_reason": trajs[i].finish_reason,
        }
        for i in range(0, len(trajs), n)[:samples_to_keep]
    ]
    problems = [{"eval_set": name, "example_id": ex.id, "n": n, "correct": int(c)}
                for ex, c in zip(examples, per_problem_c)]
    return metrics, kept, problems


def evaluate(
    engine: Any, task: Task, seed: int, step: int, samples_to_keep: int = 0,
    desc: str = "eval", sets: list[EvalSet] | None = None,
) -> tuple[dict[str, float], list[dict[str, Any]], list[dict[str, Any]]]:
    """Every eval set of ``task``: (metrics, kept samples, per-problem counts). The sampling
    seed depends on (seed, step) only, so an evaluation is reproducible and independent of how
    training consumed random numbers. Progress (problems done of all sets) shows as ``desc``.
    ``sets``: the eval sets fitted to the model (harness/prompts.py); default: the task's."""
    generator = torch.Generator(engine.device).manual_seed(1_000_003 * (seed + 1) + step)
    metrics: dict[str, float] = {}
    samples: list[dict[str, Any]] = []
    problems: list[dict[str, Any]] = []
    start = time.perf_counter()
    sets = task.eval_sets() if sets is None else sets
    with Progress(sum(len(es.examples) for es in sets), desc, unit="problems",
                  final_line=False) as progress:
        for eval_set in sets:
            m, s, p = evaluate_set(engine, task, eval_set, generator, samples_to_keep, progress)
            metrics.update(m)
            samples.extend(s)
            problems.extend(p)
    metrics["time/eval"] = time.perf_counter() - start
    return metrics, samples, problems
