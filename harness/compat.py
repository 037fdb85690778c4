"""Which algorithm runs on which task: declared by both sides, checked in one place.

Every task class states what it ``offers`` and every algorithm bundle, and every rollout strategy,
advantage estimator and policy loss it is built from, states what it ``needs`` (class attributes,
beside the ``@register_*`` decorator). A pair is compatible when the task offers everything the
algorithm's parts need. Nothing is inferred from names or found out by running: a third-party
task that declares nothing offers nothing, and is refused by the algorithms that need something.

The vocabulary (:data:`CAPABILITIES`):

* ``tools``: multi-turn episodes with a tool environment (``Task.tool_env``), e.g. ARPO's and
  AEPO's branching after tool calls;
* ``images``: prompts that carry images (a VLM task);
* ``binary_correct``: a per-response correct/wrong verdict (``Score.correct``) that is meaningful
  on its own, e.g. LOPE's all-wrong groups, AGPO's correct/wrong split.

A train or sweep over an incompatible pair exits 2 with one line naming the pair and the reason
(:func:`check_config`, called by ``harness.config.validate_config``); ``rlbench list matrix`` prints
the whole algorithm x task matrix (:func:`matrix`). The suite sweep (``conf/sweep/suite.yaml``)
drops incompatible cells with ``hydra/sweeper=compatible`` (:mod:`harness.sweeper`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOOLS, IMAGES, BINARY_CORRECT = "tools", "images", "binary_correct"
CAPABILITIES: dict[str, str] = {
    TOOLS: "multi-turn tool calls",
    IMAGES: "image prompts",
    BINARY_CORRECT: "a binary correct/wrong verdict",
}


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""  # empty when ok


def _declared(obj: Any, attr: str) -> frozenset[str]:
    value = getattr(obj, attr, frozenset())
    unknown = set(value) - set(CAPABILITIES)
    if unknown:  # a typo in a declaration must not silently mean "needs nothing"
        raise ValueError(f"{getattr(obj, '__qualname__', obj)!r}.{attr} declares unknown "
                         f"capabilities {sorted(unknown)}; known: {', '.join(CAPABILITIES)}")
    return frozenset(value)


def algorithm_needs(algorithm: Any) -> dict[str, str]:
    """capability -> which part needs it, for an algorithm config node (``name`` and the
    ``rollout`` / ``advantage`` / ``loss`` nodes, each with a ``name``)."""
    from harness.registry import ADVANTAGES, ALGORITHMS, POLICY_LOSSES, ROLLOUTS

    name = str(algorithm["name"])
    parts: list[tuple[str, Any]] = [(f"algorithm {name}", ALGORITHMS.get(name))]
    for key, registry in (("rollout", ROLLOUTS), ("advantage", ADVANTAGES),
                          ("loss", POLICY_LOSSES)):
        node = algorithm.get(key) if hasattr(algorithm, "get") else None
        part = node.get("name") if node is not None and hasattr(node, "get") else None
        if part is not None:
            parts.append((f"{key} {part}", registry.get(str(part))))
    needs: dict[str, str] = {}
    for where, cls in parts:
        for cap in sorted(_declared(cls, "needs")):
            needs.setdefault(cap, where)
    return needs


def task_offers(task_name: str, task_cfg: Any = None) -> frozenset[str]:
    """What the task class declares; with its config node, less what that configuration
    withholds (a task's ``offers_for(task_cfg)``, e.g. agentic QA with no tools enabled). A
    configuration can withhold a capability, never add one."""
    from harness.registry import TASKS

    cls = TASKS.get(task_name)
    offers = _declared(cls, "offers")
    if task_cfg is not None and hasattr(cls, "offers_for"):
        offers &= frozenset(cls.offers_for(task_cfg))
    return offers


def check(algorithm: Any, task_name: str, task_cfg: Any = None) -> Verdict:
    """Is the algorithm config node compatible with the registered task ``task_name`` (as
    configured by ``task_cfg``, when given)?"""
    offers = task_offers(task_name, task_cfg)
    missing = {cap: where for cap, where in algorithm_needs(algorithm).items()
               if cap not in offers}
    if not missing:
        return Verdict(True)
    how = " as configured" if task_cfg is not None and missing.keys() & task_offers(task_name) \
        else ""
    reasons = "; ".join(f"{where} needs {CAPABILITIES[cap]} ({cap}), which task {task_name}"
                        f"{how} does not offer" for cap, where in sorted(missing.items()))
    return Verdict(False, reasons)


def check_config(cfg: Any) -> None:
    """Raise :class:`harness.typed_config.ConfigError` naming the pair and the reason when the
    composed config's algorithm cannot run on its task."""
    from harness.typed_config import ConfigError

    verdict = check(cfg.algorithm, str(cfg.task.name), cfg.task)
    if not verdict.ok:
        raise ConfigError(f"incompatible pair algorithm={cfg.algorithm.name} x "
                          f"task={cfg.task.name}: {verdict.reason}")


def algorithm_configs(conf_dir: Path) -> dict[str, Any]:
    """``conf/algorithm/<name>.yaml`` (top level: the named algorithms) -> its config node."""
    from omegaconf import OmegaConf

    return {p.stem: OmegaConf.load(p) for p in sorted((conf_dir / "algorithm").glob("*.yaml"))}


def task_configs(conf_dir: Path) -> dict[str, str]:
    """``conf/task/<option>.yaml`` -> the registered task it configures (its ``name``, or that of
    the task config it extends through its defaults list)."""
    from omegaconf import OmegaConf

    out: dict[str, str] = {}
    for p in sorted((conf_dir / "task").glob("*.yaml")):
        node = OmegaConf.load(p)
        name = node.get("name")
        for entry in node.get("defaults", []) or []:
            if name is None and isinstance(entry, str) and entry != "_self_":
                name = OmegaConf.load(conf_dir / "task" / f"{entry}.yaml").get("name")
        if name is not None:
            out[p.stem] = str(name)
    return out


def matrix(conf_dir: Path) -> tuple[list[str], list[str], dict[tuple[str, str], Verdict]]:
    """(algorithm options, task options, (algorithm, task) -> verdict) over the config groups."""
    algos, tasks = algorithm_configs(conf_dir), task_configs(conf_dir)
    cells = {(a, t): check(node, tasks[t]) for a, node in algos.items() for t in tasks}
    return list(algos), list(tasks), cells


def format_matrix(conf_dir: Path) -> str:
    """The matrix as text: one row per algorithm, ``ok`` or ``-`` per task, then the reasons."""
    algos, tasks, cells = matrix(conf_dir)
    width = max(len(a) for a in algos) + 2
    cols = [max(len(t), 2) + 2 for t in tasks]
    lines = ["".ljust(width) + "".join(t.ljust(c) for t, c in zip(tasks, cols))]
    for a in algos:
        marks = ["ok" if cells[a, t].ok else "-" for t in tasks]
        lines.append(a.ljust(width) + "".join(m.ljust(c) for m, c in zip(marks, cols)))
    reasons: dict[str, list[str]] = {}
    for a in algos:
        for t in tasks:
            if not cells[a, t].ok:
                reasons.setdefault(cells[a, t].reason, []).append(a)
    if reasons:
        lines += ["", "- = incompatible (refused with exit 2):"]
        lines += [f"  {', '.join(dict.fromkeys(names))}: {r}" for r, names in reasons.items()]
    return "\n".join(line.rstrip() for line in lines)
