"""``rlbench power``: how many seeds a comparison needs, planned from a pilot's runs.

The pilot is any board's runs (``--runs leaderboards/<board>``, or an MLflow experiment): per
board group it fits the board's own seed-blocked model (harness/report/analysis.py) on the plan's
primary metric, over the board's declared comparisons, and prints the residual SD, the family's
minimum detectable effect (MDE) at the pilot's seeds and at other seed counts, and the fewest
seeds per row at which every comparison detects ``--delta`` at the plan's level and power:

    rlbench power --runs leaderboards/testbed-offpolicy --experiment testbed_offpolicy_tuned \
        --config conf/board/offpolicy_tuned.yaml --delta 0.02
"""

from __future__ import annotations

import argparse
import contextlib
import math
import tempfile
from pathlib import Path

from harness.report.config import BoardError

SEED_COUNTS = (3, 5, 10, 15, 20, 30)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--experiment", required=True, help="the pilot's MLflow experiment")
    p.add_argument("--runs", action="append", default=[], metavar="PATH",
                   help="read exported runs (a runs.jsonl.gz or a board folder) instead of the "
                        "tracking URI (repeatable)")
    p.add_argument("--tracking-uri", "--uri", dest="uri", default=None)
    p.add_argument("--config", default=None,
                   help="board config: pairings and plan (default conf/board/default.yaml)")
    p.add_argument("--delta", type=float, action="append", default=[],
                   help="the effect to detect, in the primary metric's units (repeatable; "
                        "default: the plan's declared effect for the pilot's sweep)")


def plan_lines(uri: str, experiment: str, config: str | None, deltas: list[float]) -> list[str]:
    """The report, one line per fact."""
    from mlflow.tracking import MlflowClient

    from harness.report.analysis import mde_at, seeds_needed
    from harness.report.board import pair_rows
    from harness.report.budget import History, fill_budget
    from harness.report.collect import collect
    from harness.report.config import load_config
    from harness.report.controls import split_controls
    from harness.report.tables import declared_primary, specs_of
    from harness.report.verdict import judge

    if any(not d > 0 for d in deltas):
        raise BoardError(f"--delta must be > 0 (an effect in the primary metric's units, e.g. "
                         f"0.02), got {', '.join(map(str, deltas))}")
    cfg = load_config(config)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise BoardError(f"unknown MLflow experiment {experiment!r}; --experiment names the "
                         "pilot's experiment (the board's `Experiment:` line)")
    groups, _ = collect(client, exp.experiment_id, cfg)
    if not groups:
        raise BoardError(f"experiment {experiment!r} has no FINISHED runs")
    plan = cfg.plan
    lines = [f"plan: {cfg.source}; family level {plan.alpha:g}, power {plan.power:g}"]
    for (task, variant, model), group in sorted(groups.items()):
        rows = group.rows
        specs = specs_of(rows, cfg.select.eval_set if cfg.select else None)
        prim, specs = declared_primary(History(client), rows, specs, plan.primary, plan.better)
        pair_rows(rows, cfg, cfg.baseline)
        method = split_controls(rows, cfg)[0]  # the board's model: no controls
        at = "last evaluation"
        if plan.read == "budget":  # each run read at the common token budget, as the board
            budget = fill_budget(History(client), rows, specs, cfg.interval_options, method)
            at = ("no common token budget" if math.isnan(budget.tokens) else
                  f"at the budget of {budget.tokens:,.0f} tokens")
        v = judge(method, prim, cfg, at=at)
        a = v.analysis
        lines.append(f"{task}-{variant} / {model}: {len(rows)} rows")
        if not a.comparisons or not a.sigma > 0:
            lines.append(f"  no comparison to plan from: {a.note or v.descriptive}")
            continue
        pairs = [(c.row, c.baseline) for c in a.comparisons]
        lines += [f"  primary metric {prim.title} ({v.at}); {len(pairs)} comparisons; "
                  f"residual SD {a.sigma:.4f} ({a.df} df, {len(a.seeds)} seeds)",
                  f"  MDE at the pilot's {len(a.seeds)} seeds: {a.mde:.4f}",
                  "  MDE by seeds per row: " + ", ".join(
                      f"{n}: {mde_at(a.sigma, pairs, n, plan.alpha, plan.power):.4f}"
                      for n in SEED_COUNTS)]
        for delta in deltas or ([v.detect] if v.detect else []):
            need = seeds_needed(a.sigma, pairs, delta, plan.alpha, plan.power)
            lines.append(f"  to detect {delta:g}: "
                         + (f"{need} seeds per row" if need else "more than 200 seeds per row"))
    return lines


def cmd_power(args: argparse.Namespace) -> None:
    from harness.cli.board import load_exports
    from harness.tracking import resolve_tracking_uri

    with contextlib.ExitStack() as stack:
        uri = resolve_tracking_uri(args.uri)
        if args.runs:
            if args.uri:
                raise BoardError("--runs loads the exports into a fresh store; drop "
                                 "--tracking-uri")
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="rlbench-power-"))
            uri = f"sqlite:///{Path(tmp) / 'runs.db'}"
            load_exports(args.runs, uri, args.experiment)
        for line in plan_lines(uri, args.experiment, args.config, args.delta):
            print(line)
