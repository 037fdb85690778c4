"""From MLflow runs to leaderboard rows: a row is one configuration.

A run's *configuration* is its logged params (the flattened resolved config) minus ``seed`` and
the keys that cannot change a result (``harness.cell_plan.NON_SEMANTIC_KEYS``: where it logs and
writes, thread counts, ...). Runs are grouped by (task, task variant, model), then into rows by
their label (``algorithm``, ``@`` the values of the board's variant fields), sampling temperature
and, with a selection (``select.key``), the selected key's value. The runs of one row must share
one configuration: where they do not, :func:`collect` raises :class:`BoardError` naming the keys
that differ (exit 2) rather than pool or supersede them, e.g. a 1-step smoke run of grpo seed 0
next to a sweep's 60-step runs. Several FINISHED runs of one cell (same configuration and seed)
are reported as duplicates on the page; the newest is used.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

from mlflow.entities import Run as MlflowRun
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from harness.cell_plan import NON_SEMANTIC_KEYS
from harness.report.config import BoardConfig, BoardError
from harness.report.mlflow_log import KIND_TAG
from harness.report.tables import Row, Run

__all__ = ["EXPORTED_ID_TAG", "Group", "collect", "distinguishing_keys", "identity"]

EXPORTED_ID_TAG = "rlbench.exported_run_id"  # set on runs imported from a board's export
_PAGE = 1000
_NOT_SET = "(not set)"


# When a run evaluates and checkpoints never changes what it trains (evaluation samples from
# its own generator: tests/engine/test_eval_at_tokens.py), so tuning runs evaluated only at the
# end and reported runs evaluated every few steps at the same settings are one row.
SCHEDULE_KEYS = ("trainer.eval_every", "trainer.eval_at_start", "trainer.eval_at_tokens",
                 "trainer.checkpoint_every", "trainer.keep_checkpoints")


def identity(params: dict[str, str]) -> dict[str, str]:
    """The configuration of a run: its params minus ``seed`` and ``block_seed`` (an A/A row's
    runs differ in both, runs made before ``block_seed`` existed lack it), the non-semantic keys
    and the evaluation and checkpoint schedule."""
    def semantic(key: str) -> bool:
        return key not in ("seed", "block_seed") and not any(
            key == k or key.startswith(k + ".") for k in (*NON_SEMANTIC_KEYS, *SCHEDULE_KEYS))

    return {k: v for k, v in params.items() if semantic(k)}


@dataclass
class Group:
    """The rows of one (task, task variant, model), with what :func:`collect` set aside."""

    rows: list[Row] = field(default_factory=list)
    duplicates: list[tuple[Row, str, list[Run]]] = field(default_factory=list)  # row, seed, runs
    candidates: dict[tuple[str, str], list[Row]] = field(default_factory=dict)  # grids
    excluded: Counter[str] = field(default_factory=Counter)  # status -> count
    edges: dict[str, str] = field(default_factory=dict)  # row key -> "lowest"/"highest" choice
    unreported: list[str] = field(default_factory=list)  # tuned rows without reported seeds
    choices: dict[str, Row] = field(default_factory=dict)  # label@T -> the chosen grid row
    page: Any = None  # the page written for it (harness.report.page.Page)
    records: list[dict[str, str]] = field(default_factory=list)  # its CSV rows

    @property
    def runs(self) -> list[Run]:
        return [r for row in self.rows for r in row.runs.values()]

    @property
    def n_used(self) -> int:
        return sum(len(row.runs) for row in self.rows)


def _search(client: MlflowClient, exp_id: str, filter_string: str) -> list[MlflowRun]:
    runs: list[MlflowRun] = []
    token = None
    while True:
        page = client.search_runs(
            [exp_id], filter_string=filter_string, run_view_type=ViewType.ACTIVE_ONLY,
            max_results=_PAGE, order_by=["attributes.start_time ASC"], page_token=token,
        )
        # training runs and ``rlbench eval`` runs (rows ``<algorithm>@eval``); not leaderboards
        runs.extend(r for r in page if r.data.tags.get(KIND_TAG, "train") in ("train", "eval"))
        token = page.token
        if not token:
            break
    return sorted(runs, key=start_order)


def start_order(run: MlflowRun) -> tuple[int, str]:
    """Runs in the order they started (ties by id): of a cell run twice, the last is used."""
    return run.info.start_time or 0, run.info.run_id


def group_key(run: MlflowRun) -> tuple[str, str, str]:
    t = run.data.tags
    return tuple(t.get(f"rlbench.{k}", "unknown") for k in ("task", "task_variant", "model"))


def field_value(run: MlflowRun, key: str) -> str:
    kind, _, name = key.partition(".")
    return (run.data.tags if kind == "tags" else run.data.params).get(name, "")


_FINAL = re.compile(r"^final/(.+/(?:pass|mean|maj)_at_\d+(?:_stderr|_sampling_se)?)$")


def last_evaluation(metrics: dict[str, float]) -> dict[str, float]:
    """``metrics`` with each quality ``final/<set>/<metric>`` replaced by the run's last
    evaluation of it (``eval/<set>/<metric>`` at its highest step: MLflow's latest value). The
    primary result is the model training ended with, also for runs whose logged ``final/*``
    is the mean of their last two evaluations (half of it a half-trained model)."""
    out = dict(metrics)
    for key in metrics:
        if (m := _FINAL.match(key)) and f"eval/{m.group(1)}" in metrics:
            out[key] = metrics[f"eval/{m.group(1)}"]
    return out


def _to_run(r: MlflowRun, cfg: BoardConfig) -> Run:
    t = r.data.tags
    seed, trained = t.get("rlbench.seed", "?"), t.get("rlbench.train_seed", "")
    variant = ",".join(v for key in cfg.variant if (v := field_value(r, key)))
    select = field_value(r, cfg.select.key) if cfg.select else ""
    drop = {cfg.select.key.partition(".")[2]} if cfg.select and cfg.select.key.startswith(
        "params.") else set()
    return Run(r.info.run_id, t.get("rlbench.algorithm", "unknown"), variant,
               seed, t.get("rlbench.temperature", ""),
               t.get("rlbench.baseline", ""), last_evaluation(dict(r.data.metrics)),
               config={k: v for k, v in identity(dict(r.data.params)).items() if k not in drop},
               origin_id=t.get(EXPORTED_ID_TAG, r.info.run_id), sweep=t.get("rlbench.sweep", ""),
               commit=t.get("rlbench.git_commit", ""), select=select,
               overrides=_overrides(t.get("rlbench.overrides")),
               select_key=next(iter(drop), ""),
               marks=_marks(r.data.params.get("trainer.eval_at_tokens")),
               train_seed=trained if trained != seed else "")


def _marks(param: str | None) -> frozenset[float]:
    """A run's declared token marks (the ``trainer.eval_at_tokens`` param; none: empty)."""
    try:
        return frozenset(float(m) for m in json.loads(param or "[]"))
    except (ValueError, TypeError):
        return frozenset()


def _overrides(tag: str | None) -> tuple[str, ...] | None:
    try:
        return tuple(json.loads(tag)) if tag else None
    except ValueError:
        return None


def _differing(configs: list[dict[str, str]]) -> list[str]:
    keys = sorted({k for c in configs for k in c})
    return [k for k in keys if len({c.get(k, _NOT_SET) for c in configs}) > 1]


def _mixed(where: str, label: str, runs: list[Run]) -> BoardError:
    """The refusal: which keys differ inside one row, with the runs holding each value."""
    keys = _differing([r.config for r in runs])
    parts = []
    for key in keys[:4]:
        by_value: dict[str, list[Run]] = defaultdict(list)
        for r in runs:
            by_value[r.config.get(key, _NOT_SET)].append(r)
        values = "; ".join(
            f"{v}: {len(rs)} runs" if len(rs) > 2 else
            f"{v}: " + ", ".join(f"seed {r.seed} run {r.origin_id[:8]}" for r in rs)
            for v, rs in sorted(by_value.items(), key=lambda kv: -len(kv[1])))
        parts.append(f"{key} ({values})")
    more = f" and {len(keys) - 4} more keys" if len(keys) > 4 else ""
    return BoardError(
        f"{where}: row {label!r} would mix configurations: its runs differ in "
        f"{', '.join(parts)}{more}. A row is one configuration: move or delete the odd runs (or "
        f"give them their own tracking.experiment), or make the key part of the row label with "
        f"--variant params.{keys[0]}")


def _rows(where: str, runs: list[Run], group: Group) -> None:
    by_row: dict[tuple[str, str, str], list[Run]] = defaultdict(list)
    for run in runs:
        by_row[run.label, run.temperature, run.select].append(run)
    labels = Counter((label, sel) for label, _, sel in by_row)
    for (label, temp, sel), row_runs in sorted(by_row.items()):
        if len({tuple(sorted(r.config.items())) for r in row_runs}) > 1:
            raise _mixed(where, label if labels[label, sel] == 1 else f"{label} T={temp}",
                         row_runs)
        key = label if labels[label, sel] == 1 else f"{label} T={temp or '?'}"
        by_seed: dict[str, list[Run]] = defaultdict(list)
        for run in row_runs:  # sorted by start time: the newest run of a cell comes last
            by_seed[run.seed].append(run)
        first = row_runs[0]
        row = Row(key, label, first.algorithm, first.variant, temp,
                  {s: rs[-1] for s, rs in by_seed.items()}, select=sel)
        group.duplicates += [(row, s, rs) for s, rs in sorted(by_seed.items()) if len(rs) > 1]
        group.rows.append(row)


def distinguishing_keys(rows: list[Row]) -> tuple[list[str], list[str]]:
    """(keys outside ``algorithm.*`` whose value differs between rows, ``algorithm.*`` keys that
    differ between rows of the same algorithm): the configuration a board's rows differ in,
    beside the algorithm itself and its own knobs."""
    configs = [r.config for r in rows]
    outside = [k for k in _differing(configs) if not k.startswith("algorithm.")]
    within: set[str] = set()
    for alg in {r.algorithm for r in rows}:
        same = [r.config for r in rows if r.algorithm == alg]
        within |= {k for k in _differing(same) if k.startswith("algorithm.")}
    return outside, sorted(within)


def _select(where: str, group: Group, cfg: BoardConfig) -> None:
    """Keep, for each label and temperature, the row whose value of ``select.key`` has the best
    mean ``final/<select.metric>`` over the tuning seeds (``select.seeds``; none declared: every
    seed); the grid stays in ``group.candidates``. With tuning seeds the kept row holds only the
    other (reported) seeds' runs, and a choice at either end of a grid of three or more values
    is named in ``group.edges`` (the optimum may lie outside the grid). A declared control row
    (``plan.controls``) is kept as it is, less the tuning seeds, and must hold one value."""
    sel = cfg.select
    assert sel is not None
    tuning = set(sel.seeds)
    grids: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for row in group.rows:
        grids[row.label, row.temperature].append(row)
    kept = []
    # any sweep's controls, not only this group's: control runs made before the reported ones
    # (whose sweep declares them) must not be refused for lacking tuning runs
    controls = cfg.plan.control_labels(cfg.plan.controls)
    for (label, _temp), grid in sorted(grids.items()):
        grid.sort(key=lambda r: _sortable(r.select))
        if label in controls:
            # a control row runs at a value its sweep fixes from the baseline's choice (a tenth
            # of it, or the same): nothing to select, and it reports the seeds the others do
            if len(grid) > 1:
                raise BoardError(f"{where}: control row {label!r} (plan.controls) has runs at "
                                 f"{len(grid)} values of {sel.key}: "
                                 f"{', '.join(r.select for r in grid)}; a control is one "
                                 "configuration")
            row = replace(grid[0], runs={s: r for s, r in grid[0].runs.items()
                                         if s not in tuning})
            if row.runs:
                kept.append(row)
            continue

        def score(row: Row) -> float:
            vals = [r.metrics[f"final/{sel.metric}"] for s, r in row.runs.items()
                    if f"final/{sel.metric}" in r.metrics and (not tuning or s in tuning)]
            return sum(vals) / len(vals) if vals else math.nan

        scored = [(score(r), i, r) for i, r in enumerate(grid) if not math.isnan(score(r))]
        if not scored:
            raise BoardError(f"{where}: no run of row {label!r} logged final/{sel.metric}"
                             + (f" on the tuning seeds {', '.join(sel.seeds)}" if tuning else "")
                             + ", the selection metric of the board config (select.metric)")
        best = max(scored, key=lambda t: (t[0] if sel.higher else -t[0], -t[1]))[2]
        group.candidates[label, _temp] = grid
        group.choices[f"{label}@T={_temp}"] = best
        if len(grid) >= 3 and best in (grid[0], grid[-1]):
            group.edges[best.key] = "lowest" if best is grid[0] else "highest"
        if tuning:
            best = replace(best, runs={s: r for s, r in best.runs.items() if s not in tuning})
            if not best.runs:
                group.unreported.append(f"{label} (chose {best.select})")
                continue
        kept.append(best)
    labels = Counter(r.label for r in kept)
    for row in kept:  # keys as without a selection: the temperature only where it is needed
        old = row.key
        row.key = row.label if labels[row.label] == 1 else f"{row.label} T={row.temperature}"
        if old in group.edges:
            group.edges[row.key] = group.edges.pop(old)
    group.rows = kept


def _sortable(value: str) -> tuple[int, float, str]:
    try:
        return (0, float(value), value)
    except ValueError:
        return (1, 0.0, value)


def collect(client: MlflowClient, exp_id: str, cfg: BoardConfig,
            ) -> tuple[dict[tuple[str, str, str], Group], int]:
    """FINISHED training (and ``rlbench eval``) runs grouped into rows; returns (groups, number
    of runs in other statuses). Raises :class:`BoardError` where a row would mix
    configurations."""
    grouped: dict[tuple[str, str, str], list[Run]] = defaultdict(list)
    for r in _search(client, exp_id, "attributes.status = 'FINISHED'"):
        grouped[group_key(r)].append(_to_run(r, cfg))
    groups: dict[tuple[str, str, str], Group] = {}
    for gk, runs in sorted(grouped.items()):
        where = "{}-{} / {}".format(*gk)
        group = groups[gk] = Group()
        _rows(where, runs, group)
        if cfg.select:
            _select(where, group, cfg)
    others = _search(client, exp_id, "attributes.status != 'FINISHED'")
    for r in others:
        if group_key(r) in groups:
            groups[group_key(r)].excluded[r.info.status] += 1
    return groups, len(others)

