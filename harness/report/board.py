"""Leaderboard generator: MLflow runs -> markdown/CSV tables, PNG curves, an export of the runs
and a leaderboard run in MLflow (``rlbench board``).

Every number on a leaderboard must trace back to logged runs, so nothing here is typed by hand:
``build_leaderboards`` queries the MLflow tracking store, keeps FINISHED training runs
(``rlbench eval`` runs too, labelled ``<algorithm>@eval``; leaderboard runs are skipped; others
are counted in a footnote), groups them by (task, task_variant, model) and then into rows, one
configuration each (:mod:`harness.report.collect`: runs that differ in any resolved key but the
seed are never pooled; the board refuses, naming the keys, where a row would mix them), and
writes one directory per group with

- ``leaderboard.md``/``.csv``: per row and eval set pass@1, pass@k for every logged k, mean@n
  and maj@k, as mean with a 95% interval over seeds (:mod:`harness.report.stats`); paired
  differences against the row's baseline on shared seeds (descriptive); the declared plan's
  sensitivity controls, each tested against its baseline alone (:mod:`harness.report.controls`),
  and its primary comparisons, tested together (:mod:`harness.report.verdict`); change since step
  0; step size (learning rate, pre-clip gradient norm, share of clipped steps); cost (tokens
  generated and trained, wall time, memory); quality at the smallest common token budget; with
  a selection (``select`` in the board config, e.g. the learning rate on a validation split)
  the grid and the choice;
- PNG curves (:mod:`harness.report.plots`) against step and, for evaluations, against tokens
  generated;
- ``runs.jsonl.gz``: the runs behind the page (:mod:`harness.report.provenance`);

then an index ``README.md`` with the two commands that reproduce the board (the named sweep its
runs were launched by, ``rlbench.sweep``, and this ``rlbench board`` command), the commits the
runs were made at, the board's own commit and date, and per group a leaderboard run in the same
MLflow experiment (:mod:`harness.report.mlflow_log`). A checkout with uncommitted changes is
refused unless ``allow_dirty``. Files other than the README's date line are deterministic, so
regenerating an unchanged store gives a clean ``git diff``; ``SOURCE_DATE_EPOCH`` fixes the date.

Run conventions read here (written by the trainer): tags ``rlbench.{algorithm,task,task_variant,
model,seed,temperature,baseline,kind,sweep,git_commit}``; params (the flattened config);
summary metrics ``final/<set>/{pass,mean,maj}_at_<k>``, ``start/<set>/...``, ``final/{steps,
tokens_total,tokens_trained,wall_s,peak_mem_mb,peak_gpu_mem_mb}``; step metrics
``eval/<set>/pass_at_<k>``, ``rollout/{reward_mean,entropy,response_len_mean,tokens_total}``,
``actor/{grad_norm,grad_clipped_frac}``.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import re
import shlex
from collections import Counter
from pathlib import Path

from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from harness.claims import is_claim_experiment
from harness.report.budget import TOLERANCE, History, fill_budget
from harness.report.collect import Group, collect, distinguishing_keys
from harness.report.config import REPO, BoardConfig, BoardError, load_config
from harness.report.controls import check_controls, csv_fields, head_lines, split_controls
from harness.report.curves import fit_curve, plot_curve
from harness.report.mlflow_log import log_leaderboard
from harness.report.page import Page, commits_line, render_markdown
from harness.report.plots import write_plots
from harness.report.provenance import clean_checkout, display_tracking_uri, export_runs, reproduce
from harness.report.stats import Interval, interval, paired_interval
from harness.report.tables import (
    COSTS,
    DYNAMICS,
    Row,
    Spec,
    cell,
    declared_primary,
    late_means,
    primary_spec,
    render_csv,
    specs_of,
    table,
)
from harness.report.verdict import Verdict, judge, plan_lines

__all__ = ["BoardConfig", "build_leaderboards", "display_tracking_uri", "load_config"]

EXPORT = "runs.jsonl.gz"


# ---------------------------------------------------------------------------------- rows

def pair_rows(rows: list[Row], cfg: BoardConfig, default: str) -> None:
    """Baseline of each row: its runs' ``rlbench.baseline`` tag, else ``cfg.pairs`` for
    ``algorithm@variant`` then ``algorithm``, else ``default``. The name matches a row's label
    (or, failing that, an algorithm); among several, the one at the same temperature."""
    for row in rows:
        tagged = sorted({r.baseline for r in row.runs.values() if r.baseline})
        if tagged:
            name, via = tagged[0], "tag"
        elif row.label in cfg.pairs or row.algorithm in cfg.pairs:
            name, via = cfg.pairs.get(row.label, cfg.pairs.get(row.algorithm, "")), "pairs"
        else:
            name, via = default, "default"
        if not name or name == row.label:
            continue
        cands = [r for r in rows if r.label == name] or [r for r in rows if r.algorithm == name]
        same_t = [r for r in cands if r.temperature == row.temperature]
        chosen = same_t if len(same_t) == 1 else cands
        if len(chosen) == 1 and chosen[0] is not row:
            row.baseline, row.baseline_via = chosen[0].key, via
        elif not chosen:
            row.baseline_note = f"no {name} runs"
        elif len(chosen) > 1:
            row.baseline_note = f"{name} ambiguous"


def _fill(rows: list[Row], specs: list[Spec], cfg: BoardConfig) -> None:
    """Intervals of every row: final values, change since step 0, paired differences against
    the baseline (descriptive: the confirmatory test is harness/report/verdict.py's), dynamics
    and costs."""
    opts = cfg.interval_options
    by_key = {r.key: r for r in rows}
    for row in rows:
        base = by_key.get(row.baseline)
        for s in specs:
            fin, start = row.per_seed(f"final/{s.name}"), row.per_seed(f"start/{s.name}")
            row.final[s.name] = interval(fin.values(), *opts)
            row.start[s.name] = interval(start.values(), *opts)
            row.delta[s.name] = interval([fin[k] - start[k] for k in fin if k in start], *opts)
            if base:
                row.vs[s.name] = paired_interval(fin, base.per_seed(f"final/{s.name}"), *opts)
        for d in DYNAMICS:
            late = row.per_seed(f"final/{d.key}")
            row.final[d.key] = interval(late.values(), *opts)
            if base and d.paired:
                row.vs[d.key] = paired_interval(late, base.per_seed(f"final/{d.key}"), *opts)
        for c in COSTS:
            row.cost[c.key] = interval(row.per_seed(f"final/{c.key}").values(), *opts)


def _read(row: Row, prim: Spec, read: str) -> Interval:
    """A row's primary where the plan reads it: its last evaluation, or at the token budget."""
    nothing = Interval(math.nan, math.nan, math.nan, 0, "none")
    return row.final.get(prim.name, nothing) if read == "final" else \
        row.budget.get(prim.name, nothing)


def _rank(rows: list[Row], prim: Spec | None, read: str = "final") -> list[Row]:
    """Best first where the plan reads the primary (lowest first for a lower-is-better one),
    rows without it last."""
    def order(row: Row) -> tuple[bool, float, str]:
        m = _read(row, prim, read).mean if prim else math.nan
        if math.isnan(m):
            return (True, 0.0, row.key)
        return (False, m if prim and prim.lower_is_better else -m, row.key)

    return sorted(rows, key=order)


def _styles(rows: list[Row]) -> None:
    seen: Counter[str] = Counter()
    for row in sorted(rows, key=lambda r: r.key):
        row.style_index = seen[row.algorithm]
        seen[row.algorithm] += 1


# ---------------------------------------------------------------------------------- pages

_plots = write_plots  # the group's PNGs: harness/report/plots.py


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip(".") or "_"


def _today() -> str:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    now = (_dt.datetime.fromtimestamp(int(epoch), _dt.timezone.utc) if epoch
           else _dt.datetime.now(_dt.timezone.utc))
    return now.strftime("%Y-%m-%d")


def _shown_out(out: Path) -> str:
    try:
        return out.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return out.resolve().name


# ---------------------------------------------------------------------------------- build

def build_leaderboards(
    tracking_uri: str,
    experiment: str = "rlbench",
    out_dir: str | Path = "leaderboards",
    baseline: str | None = None,
    config: str | Path | None = None,
    log_to_mlflow: bool = True,
    *,
    variant: tuple[str, ...] = (),
    allow_dirty: bool = False,
    export: bool = True,
    suite: bool = False,
    suite_reps: int = 2000,
    runs: tuple[str, ...] = (),
) -> list[Path]:
    """Query ``experiment`` at ``tracking_uri`` and write leaderboards under ``out_dir``.

    ``config`` is the board config (pairings, row labels, intervals, selection; default
    ``conf/board/default.yaml``); ``baseline`` replaces its default baseline; ``variant`` adds
    run fields to the row labels. ``log_to_mlflow`` also logs each leaderboard as a run of the
    experiment, replacing the previous one; ``export`` writes each group's runs to
    ``runs.jsonl.gz``. Returns the written files, sorted. Raises :class:`BoardError` for an
    unknown experiment, one without FINISHED runs, a row that would mix configurations, a bad
    config, or a checkout with uncommitted changes (unless ``allow_dirty``). ``suite`` also
    writes the cross-task aggregate (:mod:`harness.report.aggregate`) to ``<out_dir>/aggregate``,
    refusing, before anything is written, cells with several runs; ``suite_reps`` bootstrap
    resamples (rliable's loops are slow: 2000 take minutes on the full suite). ``runs`` names
    the exports a temporary ``tracking_uri`` was loaded from (``rlbench board --runs``); the
    pages then show those instead of the store.
    """
    cfg = load_config(config, variant)
    default = baseline if baseline is not None else cfg.baseline
    out = Path(out_dir)
    state = clean_checkout(out, allow_dirty)
    shown_runs = [_shown_out(Path(r)) for r in runs]
    shown_uri = (f"the exported runs in {', '.join(shown_runs)}" if runs else
                 display_tracking_uri(tracking_uri, out.resolve().parent))
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None or exp.lifecycle_stage != "active":  # a deleted experiment is "unknown" too
        names = sorted(e.name for e in client.search_experiments(ViewType.ACTIVE_ONLY)
                       if not is_claim_experiment(e.name))
        raise BoardError(f"unknown MLflow experiment {experiment!r} at {shown_uri}; existing "
                         f"experiments: {', '.join(map(repr, names)) or '(none)'}")
    groups, n_other = collect(client, exp.experiment_id, cfg)
    if not groups:
        raise BoardError(f"experiment {experiment!r} at {shown_uri} has no FINISHED runs "
                         f"({n_other} run(s) in other statuses)")
    args = ["--experiment", experiment, "--out", _shown_out(out)]
    args += ["--baseline", baseline] if baseline is not None else []
    args += ["--config", cfg.source] if config is not None else []
    args += [a for v in variant for a in ("--variant", v)]
    args = ["--suite", *args] if suite else args
    agg = None
    if suite:  # computed (and refused) before any page is written
        from harness.report.aggregate import aggregate, task_scores

        agg = aggregate([task_scores("{}-{} / {}".format(*gk), g.rows, g.duplicates, cfg)
                         for gk, g in sorted(groups.items())], reps=suite_reps,
                        confidence=cfg.confidence)
    board_cmd = "rlbench board " + " ".join(map(shlex.quote, args))
    args += [] if log_to_mlflow else ["--no-mlflow"]
    source = [a for r in shown_runs for a in ("--runs", r)] or ["--tracking-uri", shown_uri]
    store = (f"- Tracking URI: none; {shown_uri}, loaded into a temporary store"
             if runs else f"- Tracking URI: `{shown_uri}`")
    command = "rlbench board " + " ".join(map(shlex.quote, [*source, *args]))
    all_rows = [r for g in groups.values() for r in g.rows]
    commit, date = state.describe(allow_dirty), _today()
    head = ["> Generated by `rlbench board` from MLflow queries — do not edit by hand.", "",
            f"- Experiment: `{experiment}`", store,
            f"- Command: `{command}`",
            reproduce([r for row in all_rows for r in row.runs.values()], board_cmd,
                      cfg.reproduce, cfg.select.key.partition(".")[2] if cfg.select else None),
            f"- Board built at commit `{commit}`."]
    sweeps = {r.sweep for row in all_rows for r in row.runs.values()}
    head += [f"- What recipe `{s}` cannot show: {cfg.limits[s]}"
             for s in sorted(sweeps & cfg.limits.keys())]
    history = History(client)
    written: list[Path] = []
    index: list[str] = []
    for (task, variant_, model), group in sorted(groups.items()):
        d = out / _safe(f"{task}-{variant_}") / _safe(model)
        d.mkdir(parents=True, exist_ok=True)
        files, summary = _write_group(client, history, d, f"{task}-{variant_} / {model}", group,
                                      cfg, default, head, export)
        written += files
        link = d.relative_to(out).as_posix() + "/leaderboard.md"
        index += [f"- [{task}-{variant_} / {model}]({link}) — {summary}; {len(group.rows)} rows, "
                  f"{group.n_used} runs",
                  f"  - made by `{command}` at commit `{commit}` on {date}"]
        if log_to_mlflow:
            _log(client, exp.experiment_id, group, (task, variant_, model), files, cfg, default,
                 {"experiment": experiment, "command": command, "commit": commit})
    if agg is not None:
        from harness.report.aggregate import OUT_NAME, write_aggregate

        written += write_aggregate(agg, out, head, cfg.confidence, suite_reps)
        index.insert(0, f"- [Suite aggregate across {len(agg.tasks)} tasks]({OUT_NAME}/"
                        "aggregate.md): IQM, mean, P(> grpo), performance profiles (rliable)")
    n_fin = sum(g.n_used + sum(len(rs) - 1 for _, _, rs in g.duplicates)
                for g in groups.values())
    readme = ["# rlbench leaderboards", "", *head,
              commits_line(Counter(r.commit for row in all_rows for r in row.runs.values())),
              f"- Date: {date} (UTC)",
              f"- Generated from {n_fin} finished runs ({n_other} run(s) in other statuses "
              "excluded).", "", *index]
    (out / "README.md").write_text("\n".join(readme) + "\n")
    written.append(out / "README.md")
    return sorted(written)


def _write_group(client: MlflowClient, history: History, d: Path, title: str, group: Group,
                 cfg: BoardConfig, default: str, head: list[str], export: bool,
                 ) -> tuple[list[Path], str]:
    rows = group.rows
    specs = specs_of(rows, cfg.select.eval_set if cfg.select else None)
    prim, specs = declared_primary(history, rows, specs, cfg.plan.primary, cfg.plan.better)
    if prim is None and cfg.plan.primary is not None:
        raise BoardError(f"{title}: the plan's primary metric {cfg.plan.primary!r} "
                         f"({cfg.source}) was not logged; logged: "
                         f"{', '.join(s.name for s in specs) or 'none'}")
    pair_rows(rows, cfg, default)
    late_means(history, rows, cfg.final_window)
    _fill(rows, specs, cfg)
    # controls are tested apart, each against its baseline alone: never in the plan's model,
    # nor in what sets the token budget the plan may read at
    method, controls = split_controls(rows, cfg)
    budget = fill_budget(history, rows, specs, cfg.interval_options, common=method)
    at = "last evaluation" if cfg.plan.read == "final" else (
        f"evaluation at the common budget of {budget.tokens:,.0f} tokens generated (within "
        f"{TOLERANCE:.0%})" if not math.isnan(budget.tokens) else
        "evaluation at the common token budget (none: no evaluation every run shares)")
    check_controls(controls, rows, prim, cfg.plan.read)
    verdict = judge(method, prim, cfg, edges=group.edges, at=at,
                    selected_on_reported=cfg.select is not None and not cfg.select.seeds)
    sweeps = sorted({r.sweep for r in group.runs})
    curves = [fit_curve(rows, spec, cfg.confidence, cfg.plan.power)
              for spec in dict.fromkeys(s for w in sweeps for s in cfg.curves.get(w, ()))
              if any(r.algorithm == spec.rows for r in rows)]
    rows = group.rows = _rank(rows, prim, cfg.plan.read)
    _styles(rows)
    outside, within = distinguishing_keys(rows)
    n_dup = sum(len(rs) - 1 for _, _, rs in group.duplicates)
    excl = sum(group.excluded.values())
    n_grid = sum(len(c.runs) for grid in group.candidates.values() for c in grid)
    page_head = [*head, f"- Pairing config: `{cfg.source}`; default baseline `{default}`.",
                 commits_line(Counter(r.commit for r in group.runs)),
                 f"- Generated from {group.n_used + n_dup} finished runs"
                 + (f" ({n_dup} duplicates)" if n_dup else "")
                 + (f" at the selected values; the selection read all {n_grid} runs of the "
                    "grid (Selection)" if n_grid else "")
                 + ("; runs in other statuses excluded[^excluded]." if excl else "."),
                 f"- Primary metric: {prim.title} ({at})." if prim else
                 "- No `final/<set>/pass_at_<k>` metrics were logged.",
                 *plan_lines(verdict, cfg), *head_lines(controls)]
    if group.unreported:
        page_head.append("- Tuned, not yet run on the reported seeds: "
                         + ", ".join(group.unreported) + ".")
    selection = []
    if cfg.select:
        metric, tuning = f"final/{cfg.select.metric}", set(cfg.select.seeds)
        for row in rows:
            grid = group.candidates.get((row.label, row.temperature))
            if grid is None:  # a control row: run at a value fixed by its sweep, not selected
                continue
            selection.append((row.key, [(c.select, interval(
                [v for s, v in c.per_seed(metric).items() if not tuning or s in tuning],
                *cfg.interval_options)) for c in grid], row.select))
    page = Page(title, page_head, rows, specs, _plots(history, d, title, rows, specs, cfg),
                outside, within, selection, budget, group.duplicates, dict(group.excluded),
                verdict, controls, curves)
    titles = {dyn.key: dyn.title for dyn in DYNAMICS}
    for curve in curves:
        plot_curve(curve, d / curve.png, titles.get(curve.spec.y, curve.spec.y))
    records = table(rows, specs, cfg.confidence)
    comps = {c.row: c for c in verdict.analysis.comparisons}
    checks = controls.by_key()
    for rec in records:  # the confirmatory comparison beside the descriptive columns
        ctl = checks.get(rec["row"])
        c = ctl.comparison if ctl else comps.get(rec["row"])
        # a control's own test (a family of one) is significant whether or not the board is
        # confirmatory; a method row's ‡ only on a confirmatory board
        sig = c is not None and c.significant and (ctl is not None or verdict.confirmatory)
        rec |= {"primary_identical_to": verdict.identical.get(rec["row"], ""),
                **{f"primary_{k}": "" if c is None else f"{getattr(c, k):.6g}"
                   for k in ("estimate", "se", "t", "low", "high", "p_adjusted", "mde")},
                "primary_significant": "" if c is None else str(int(sig)),
                **csv_fields(controls, rec["row"])}
    (d / "leaderboard.md").write_text(render_markdown(page, cfg, default))
    (d / "leaderboard.csv").write_text(render_csv(records))
    files = [d / "leaderboard.md", d / "leaderboard.csv", *(d / n for n, _ in page.plots),
             *(d / c.png for c in curves)]
    if export:
        ids = [r.run_id for r in group.runs] + [r.run_id for _, _, rs in group.duplicates
                                                for r in rs[:-1]]
        ids += [r.run_id for grid in group.candidates.values() for c in grid
                for r in c.runs.values()]
        files.append(export_runs(client, ids, d / EXPORT))
    group.page, group.records = page, records  # for the MLflow leaderboard run
    return files, _summary(rows, prim, verdict, cfg.plan.read) + (
        f"; {controls.status}" if controls.status
                                                   else "")


def _summary(rows: list[Row], prim: Spec | None, verdict: Verdict, read: str = "final") -> str:
    """The index line of a page: the top row by mean where the plan reads the primary, never
    called "best" (a better mean is not a difference), with the plan's verdict."""
    if prim is None:
        return "no final pass@k metrics"
    top, title = rows[0], prim.title + (" at the token budget" if read == "budget" else "")
    if len(rows) == 1:
        return f"one row, **{top.key}**: {title} {cell(_read(top, prim, read))}"
    comps = verdict.analysis.comparisons
    tail = (f"{sum(c.significant for c in comps)} of {len(comps)} primary comparisons "
            f"significant (seed-blocked, Dunnett-adjusted; MDE {verdict.analysis.mde:.3f})"
            if verdict.confirmatory else "descriptive only")
    most = "lowest" if prim.lower_is_better else "highest"
    return f"{most} mean {title}: **{top.key}** {cell(_read(top, prim, read))}; {tail}"


def _log(client: MlflowClient, exp_id: str, group: Group, key: tuple[str, str, str],
         files: list[Path], cfg: BoardConfig, default: str, info: dict[str, str]) -> None:
    from harness.report.tables import quality_table

    task, variant, model = key
    page = group.page
    note = "\n".join([f"# Leaderboard {page.title}", "", *page.head[2:], "",
                      *quality_table(page.rows, page.specs), "",
                      "Artifacts: leaderboard.md, leaderboard.csv, leaderboard_table.json, "
                      "runs.json, PNG curves."])
    prim = primary_spec(page.specs, cfg.plan.primary, cfg.plan.better)
    grids = {f"{row}": ",".join(f"{v}:{iv.mean:.6g}" for v, iv in grid) + f"|{chosen}"
             for row, grid, chosen in page.selection}
    log_leaderboard(
        client, exp_id, name=f"leaderboard {task}-{variant}/{model}",
        group_tags={"rlbench.task": task, "rlbench.task_variant": variant,
                    "rlbench.model": model},
        files=files, records=group.records, row_runs={r.key: r.run_ids for r in page.rows},
        info={**info, "baseline": default, "config": cfg.source,
              "primary": prim.name if prim else "",
              **({"select.key": cfg.select.key, "select.metric": cfg.select.metric}
                 if cfg.select else {})},
        note=note, selection=grids)
