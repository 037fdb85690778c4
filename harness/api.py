"""The public API for plugins: everything an algorithm or task package outside this repository
imports from rlbench, in one module. Import from here, not from the modules behind it; those may
move, these names stay (a change here is a breaking change, named in the release notes).

A plugin is an installed package that declares entry points in its ``pyproject.toml``:

* ``rlbench.algorithms`` (or ``rlbench.tasks``): a module rlbench imports when it first looks
  up an algorithm (a task); its ``@register_*`` decorators register what it defines;
* ``rlbench.conf``: a config package (a folder of YAML with an ``__init__.py``, shipped as
  package data) that joins Hydra's search path, so ``algorithm=<name>`` finds
  ``algorithm/<name>.yaml`` there.

``examples/rlbench_grpo_pos`` is a complete algorithm plugin in one module and one YAML file
(``tests/cli/test_plugin.py`` installs it and trains a step, and fails if it imports anything from
``harness`` but this module).

Registering
    :func:`register_algorithm`, :func:`register_advantage`, :func:`register_policy_loss`,
    :func:`register_rollout`, :func:`register_task`, :func:`register_verifier`: decorators that
    register a class (or factory) under a name. A name registered twice is an error.
    :data:`ALGORITHMS`, :data:`ADVANTAGES`, :data:`POLICY_LOSSES`, :data:`ROLLOUTS`,
    :data:`TASKS`, :data:`VERIFIERS`: the registries, to reuse a built-in part by name at run
    time (``ADVANTAGES.get("grpo")``), never by importing ``algorithms`` or ``tasks``.

Algorithms (``conf/algorithm/<name>.yaml`` holds every knob; docs/adding-an-algorithm.md)
    :class:`Algorithm`: the bundle (rollout strategy + advantage estimator + policy loss) that
    ``@register_algorithm`` subclasses, overriding a stage only when the method changes the data
    flow. :class:`AlgorithmConfig`, :class:`Aggregator` (loss aggregation modes),
    :func:`kl_penalty`. :class:`AdvantageEstimator` and :class:`PolicyLoss`: what an advantage
    estimator and a policy loss are called with and return. :class:`PPOClipLoss` (GRPO's loss,
    to subclass) and :func:`token_advantages`. :class:`RolloutBatch`: the tensors of a batch of
    sampled responses (``batch["rewards"]``, ``batch["group_index"]`` ...); :class:`RolloutContext`:
    what a rollout strategy gets. The group helpers (:func:`group_mean`, :func:`group_std`,
    :func:`gather` ...) reduce per-response values over the samples of one prompt.

Tasks (``conf/task/<name>.yaml``; docs/adding-a-task.md)
    :class:`Task` (the base class: data, verification, provenance) and :class:`VariantTask`
    (a ``tiny`` and a ``full`` section), :class:`EvalSet`, :class:`EvalProtocol`,
    :class:`Example`, :class:`Score`, :class:`SamplingParams`, :class:`Trajectory`.

Errors
    :class:`ConfigError`: a bad knob (``rlbench`` exits 2 with its message, one line).
    :class:`RegistryError`: an unknown or duplicate name.
"""

from __future__ import annotations

from harness.algorithm import (
    AdvantageEstimator,
    Aggregator,
    Algorithm,
    AlgorithmConfig,
    PolicyLoss,
    kl_penalty,
)
from harness.batch import RolloutBatch
from harness.groups import (
    gather,
    group_count,
    group_max,
    group_mean,
    group_min,
    group_std,
    group_sum,
    num_groups,
)
from harness.policy_loss import PPOClipLoss, token_advantages
from harness.registry import (
    ADVANTAGES,
    ALGORITHMS,
    POLICY_LOSSES,
    ROLLOUTS,
    TASKS,
    VERIFIERS,
    RegistryError,
    register_advantage,
    register_algorithm,
    register_policy_loss,
    register_rollout,
    register_task,
    register_verifier,
)
from harness.rollout import RolloutContext
from harness.task import EvalProtocol, EvalSet, Task, VariantTask
from harness.typed_config import ConfigError
from harness.types import Example, SamplingParams, Score, Trajectory

__all__ = [
    "ADVANTAGES",
    "ALGORITHMS",
    "POLICY_LOSSES",
    "ROLLOUTS",
    "TASKS",
    "VERIFIERS",
    "AdvantageEstimator",
    "Aggregator",
    "Algorithm",
    "AlgorithmConfig",
    "ConfigError",
    "EvalProtocol",
    "EvalSet",
    "Example",
    "PPOClipLoss",
    "PolicyLoss",
    "RegistryError",
    "RolloutBatch",
    "RolloutContext",
    "SamplingParams",
    "Score",
    "Task",
    "Trajectory",
    "VariantTask",
    "gather",
    "group_count",
    "group_max",
    "group_mean",
    "group_min",
    "group_std",
    "group_sum",
    "kl_penalty",
    "num_groups",
    "register_advantage",
    "register_algorithm",
    "register_policy_loss",
    "register_rollout",
    "register_task",
    "register_verifier",
    "token_advantages",
]
