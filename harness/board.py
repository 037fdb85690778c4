"""Leaderboard generator: MLflow runs -> markdown/CSV tables and PNG curves (``rlbench board``).

Every number on a leaderboard must trace back to logged runs, so nothing here is typed by hand:
``build_leaderboards`` queries the MLflow tracking store, keeps FINISHED runs only (others are
counted in a footnote), groups them by (task, task_variant, model) and writes one directory per
group with ``leaderboard.md``/``.csv`` (one row per algorithm, Student-t CIs over seeds, paired
differences vs a baseline on shared seeds) plus ``pass_at_1.png`` and ``entropy.png``, then an
index ``README.md``. Output is deterministic (sorted, no timestamps) so regenerating an unchanged
store gives a clean ``git diff``.

Run conventions read here (written by the trainer): tags ``rlbench.{algorithm,task,task_variant,
model,seed,temperature,baseline}``; summary metrics ``final/<set>/pass_at_<k>``,
``start/<set>/pass_at_<k>``, ``final/{steps,tokens_total,wall_s}``; step metrics
``eval/<set>/pass_at_<k>`` and ``rollout/entropy``.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from mlflow.entities import Run, ViewType
from mlflow.tracking import MlflowClient

from harness.stats import mean_ci, paired_diff

__all__ = ["build_leaderboards", "display_tracking_uri"]

_PAGE = 1000  # search_runs page size
_SMOOTH = 5  # trailing moving-average window (in logged points) for the entropy curve
_FINAL_RE = re.compile(r"^final/(.+)/pass_at_(\d+)$")
_SECRET_RE = re.compile(r"pass|secret|token|key|cred|auth|sig", re.IGNORECASE)
_COLUMNS_NOTE = (
    "Columns: pass@k is the unbiased Codex estimator (Chen et al., 2021) over n samples per "
    "problem; *final* = mean of the last two evaluations; *start* = the step-0 evaluation (mean "
    "over seeds); *Δ start* = mean of per-seed final − start; *Δ vs base* = paired difference "
    "final − baseline final over the seeds both have; ± = Student-t 95% CI half-width over seeds "
    "(n/a with one seed); steps, tokens (generated, `final/tokens_total`) and wall seconds are "
    "means over seeds."
)


@dataclass
class _Run:
    run_id: str
    algorithm: str
    seed: str
    temperature: str
    baseline: str
    metrics: dict[str, float]


@dataclass
class _Group:
    runs: dict[str, dict[str, _Run]] = field(default_factory=dict)  # algorithm -> seed -> run
    superseded: list[_Run] = field(default_factory=list)
    excluded: Counter[str] = field(default_factory=Counter)  # status -> count


def _seed_key(seed: str) -> tuple[int, float, str]:
    try:
        return (0, float(seed), seed)
    except ValueError:
        return (1, 0.0, seed)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip(".") or "_"


def _rel_or_name(path: str, base: Path) -> str:
    p = Path(path).expanduser().resolve()
    try:
        return p.relative_to(base.resolve()).as_posix()
    except ValueError:
        return p.name


def display_tracking_uri(uri: str, base: Path) -> str:
    """``uri`` safe to publish: credentials and secret-looking query parameters removed; a
    local store (sqlite, file) shown relative to ``base`` when under it, else by basename."""
    if uri.startswith("sqlite:"):
        path = uri[len("sqlite:///") :].split("?", 1)[0] if uri.startswith("sqlite:///") else ""
        return "sqlite:///" + _rel_or_name(path, base) if path else "sqlite://"
    parts = urlsplit(uri)
    if parts.scheme in ("", "file"):
        return _rel_or_name(parts.path if parts.scheme else uri, base)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if not _SECRET_RE.search(k)])
    return urlunsplit((parts.scheme, host, parts.path, query, ""))


def _search(client: MlflowClient, exp_id: str, filter_string: str) -> list[Run]:
    runs: list[Run] = []
    token = None
    while True:
        page = client.search_runs(
            [exp_id], filter_string=filter_string, run_view_type=ViewType.ACTIVE_ONLY,
            max_results=_PAGE, order_by=["attributes.start_time ASC"], page_token=token,
        )
        runs.extend(page)
        token = page.token
        if not token:
            break
    return sorted(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id))


def _group_key(run: Run) -> tuple[str, str, str]:
    t = run.data.tags
    return tuple(t.get(f"rlbench.{k}", "unknown") for k in ("task", "task_variant", "model"))


def _collect(client: MlflowClient, exp_id: str) -> tuple[dict[tuple[str, str, str], _Group], int]:
    """FINISHED runs grouped; one run per (algorithm, seed): the latest started, the rest
    listed as superseded. Returns (groups, number of non-finished runs)."""
    groups: dict[tuple[str, str, str], _Group] = defaultdict(_Group)
    for r in _search(client, exp_id, "attributes.status = 'FINISHED'"):
        t = r.data.tags
        run = _Run(r.info.run_id, t.get("rlbench.algorithm", "unknown"),
                   t.get("rlbench.seed", "?"), t.get("rlbench.temperature", ""),
                   t.get("rlbench.baseline", ""), dict(r.data.metrics))
        by_seed = groups[_group_key(r)].runs.setdefault(run.algorithm, {})
        if run.seed in by_seed:  # runs are sorted by start time: the later one wins
            groups[_group_key(r)].superseded.append(by_seed[run.seed])
        by_seed[run.seed] = run
    others = _search(client, exp_id, "attributes.status != 'FINISHED'")
    for r in others:
        if _group_key(r) in groups:
            groups[_group_key(r)].excluded[r.info.status] += 1
    return dict(groups), len(others)


def _history(client: MlflowClient, run_id: str, key: str) -> dict[int, float]:
    hist = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
    return {m.step: m.value for m in hist}  # a step logged twice: the last write wins


def _align(hists: list[dict[int, float]]) -> tuple[np.ndarray, np.ndarray] | None:
    """Seeds may evaluate at different steps. We keep the steps *every* seed logged, so each
    plotted point is a real measurement of all seeds; only when seeds share fewer than two steps
    do we linearly interpolate each seed onto the union of steps inside their common range.
    Returns (steps, values[seed, step]) or None when nothing overlaps."""
    hists = [h for h in hists if h]
    if not hists:
        return None
    shared = sorted(set.intersection(*(set(h) for h in hists)))
    if len(shared) >= 2 or (len(shared) == 1 and len(hists) == 1):
        return np.array(shared), np.array([[h[s] for s in shared] for h in hists])
    lo, hi = max(min(h) for h in hists), min(max(h) for h in hists)
    steps = np.array(sorted({s for h in hists for s in h if lo <= s <= hi}))
    if steps.size == 0:
        return None
    vals = [np.interp(steps, sorted(h), [h[s] for s in sorted(h)]) for h in hists]
    return steps, np.array(vals)


def _moving_avg(y: np.ndarray, w: int) -> np.ndarray:
    c = np.cumsum(np.insert(y, 0, 0.0))
    idx = np.arange(1, y.size + 1)
    start = np.maximum(idx - w, 0)
    return (c[idx] - c[start]) / (idx - start)


def _plot(path: Path, curves: dict[str, tuple[np.ndarray, np.ndarray]], title: str,
          ylabel: str, smooth: int = 1) -> None:
    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for alg in sorted(curves):
        steps, vals = curves[alg]
        mean, lo, hi = (_moving_avg(v, smooth) for v in (vals.mean(0), vals.min(0), vals.max(0)))
        (line,) = ax.plot(steps, mean, label=f"{alg} (n={vals.shape[0]})")
        ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    if curves:
        ax.legend(loc="best", fontsize="small")
    else:
        ax.text(0.5, 0.5, "no data logged", ha="center", va="center", transform=ax.transAxes)
    ax.set(title=title, xlabel="training step", ylabel=ylabel)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})


def _curves(client: MlflowClient, runs: dict[str, dict[str, _Run]], key: str,
            ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for alg, by_seed in runs.items():
        aligned = _align([_history(client, r.run_id, key) for r in by_seed.values()])
        if aligned is not None:
            out[alg] = aligned
    return out


def _specs(runs: dict[str, dict[str, _Run]]) -> list[tuple[str, int]]:
    """(eval set, k) pairs with a final metric, eval sets by name then k ascending."""
    found = {(m.group(1), int(m.group(2)))
             for by_seed in runs.values() for r in by_seed.values() for key in r.metrics
             if (m := _FINAL_RE.match(key))}
    return sorted(found)


def _primary(specs: list[tuple[str, int]]) -> tuple[str, int] | None:
    """The first eval set (by name) at pass@1, or its smallest k if pass@1 was not logged."""
    return min((s for s in specs if s[0] == specs[0][0]), key=lambda s: (s[1] != 1, s[1]),
               default=None)


def _per_seed(by_seed: dict[str, _Run], key: str) -> dict[str, float]:
    return {s: r.metrics[key] for s, r in by_seed.items() if key in r.metrics}


def _rows(group: _Group, specs: list[tuple[str, int]], default_base: str) -> list[dict]:
    rows = []
    for alg, by_seed in group.runs.items():
        tagged = sorted({r.baseline for r in by_seed.values() if r.baseline})
        base = tagged[0] if tagged else default_base
        base = base if base != alg and base in group.runs else ""
        seeds = sorted(by_seed, key=_seed_key)
        row: dict = {"algorithm": alg, "baseline": base, "n_seeds": len(seeds), "seeds": seeds,
                     "temperature": "/".join(sorted({r.temperature for r in by_seed.values()})),
                     "run_ids": [(s, by_seed[s].run_id) for s in seeds]}
        for ev, k in specs:
            name = f"{ev}/pass_at_{k}"
            fin = _per_seed(by_seed, f"final/{name}")
            start = _per_seed(by_seed, f"start/{name}")
            row[f"{name}/final"] = mean_ci(fin.values())
            row[f"{name}/start"] = mean_ci(start.values())[0]
            row[f"{name}/delta_start"] = mean_ci(fin[s] - start[s] for s in fin if s in start)
            row[f"{name}/vs_base"] = (paired_diff(fin, _per_seed(group.runs[base], f"final/{name}"))
                                      if base else (math.nan, math.nan, 0))
        for col in ("steps", "tokens_total", "wall_s"):
            row[col] = mean_ci(_per_seed(by_seed, f"final/{col}").values())[0]
        rows.append(row)
    prim = _primary(specs)
    pkey = f"{prim[0]}/pass_at_{prim[1]}/final" if prim else ""

    def order(row: dict) -> tuple[bool, float, str]:
        m = row[pkey][0] if pkey else math.nan
        return (math.isnan(m), -m if not math.isnan(m) else 0.0, row["algorithm"])

    return sorted(rows, key=order)


def _num(x: float) -> str:
    return f"{x:.3f}"  # nan -> "nan"


def _pm(mean: float, half: float, signed: bool = False) -> str:
    if math.isnan(mean):
        return "—"
    m = f"{mean:+.3f}" if signed else f"{mean:.3f}"
    return f"{m} ± {'n/a' if math.isnan(half) else f'{half:.3f}'}"


def _int(x: float, fmt: str) -> str:
    return "—" if math.isnan(x) else format(x, fmt)


def _csv(rows: list[dict], specs: list[tuple[str, int]]) -> str:
    header = ["algorithm", "baseline", "n_seeds", "seeds", "temperature"]
    for ev, k in specs:
        n = f"{ev}/pass_at_{k}"
        header += [f"{n}/final_mean", f"{n}/final_ci95", f"{n}/start_mean",
                   f"{n}/delta_start_mean", f"{n}/delta_start_ci95", f"{n}/vs_baseline_mean",
                   f"{n}/vs_baseline_ci95", f"{n}/vs_baseline_pairs"]
    header += ["steps_mean", "tokens_total_mean", "wall_s_mean", "run_ids"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    for r in rows:
        line = [r["algorithm"], r["baseline"], r["n_seeds"], ";".join(r["seeds"]), r["temperature"]]
        for ev, k in specs:
            n = f"{ev}/pass_at_{k}"
            bm, bh, bn = r[f"{n}/vs_base"]
            line += [*map(_num, (*r[f"{n}/final"], r[f"{n}/start"], *r[f"{n}/delta_start"])),
                     _num(bm), _num(bh), bn]
        line += [_num(r["steps"]), _num(r["tokens_total"]), _num(r["wall_s"]),
                 ";".join(rid for _, rid in r["run_ids"])]
        w.writerow(line)
    return buf.getvalue()


def _markdown(title: str, head: list[str], group: _Group, rows: list[dict],
              specs: list[tuple[str, int]]) -> str:
    n_used, n_sup = sum(len(s) for s in group.runs.values()), len(group.superseded)
    excl = sum(group.excluded.values())
    prim = _primary(specs)
    lines = [f"# {title}", "", *head, f"- Generated from {n_used + n_sup} finished runs"
             + (f" ({n_sup} superseded)" if n_sup else "")
             + ("; runs in other statuses excluded[^excluded]." if excl else "."),
             f"- Primary metric: `{prim[0]}` pass@{prim[1]} (final)." if prim else
             "- No `final/<set>/pass_at_<k>` metrics were logged.", "", _COLUMNS_NOTE, ""]
    cols = ["#", "algorithm"]
    for ev, k in specs:
        cols += [f"{ev} pass@{k}", "start", "Δ start", "Δ vs base"]
    cols += ["base", "seeds", "steps", "tokens", "wall s"]
    lines += ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for i, r in enumerate(rows, 1):
        cells = [str(i), f"**{r['algorithm']}**"]
        for ev, k in specs:
            n = f"{ev}/pass_at_{k}"
            bm, bh, bn = r[f"{n}/vs_base"]
            vs = "—" if bn == 0 else _pm(bm, bh, signed=True)
            if bn and bn != r["n_seeds"]:
                vs += f" ({bn} pairs)"
            start = r[f"{n}/start"]
            cells += [_pm(*r[f"{n}/final"]), "—" if math.isnan(start) else f"{start:.3f}",
                      _pm(*r[f"{n}/delta_start"], signed=True), vs]
        cells += [r["baseline"] or "—", str(r["n_seeds"]), _int(r["steps"], ".1f"),
                  _int(r["tokens_total"], ",.0f"), _int(r["wall_s"], ".1f")]
        lines.append("| " + " | ".join(cells) + " |")
    ev = prim[0] if prim else "?"
    lines += ["", f"![{ev} pass@1 vs step](pass_at_1.png)", "",
              "![rollout entropy vs step](entropy.png)", "",
              "<details><summary>MLflow runs behind each row</summary>", ""]
    for r in rows:
        ids = ", ".join(f"seed {s}: `{rid}`" for s, rid in r["run_ids"])
        lines.append(f"- **{r['algorithm']}** (temperature {r['temperature'] or '?'}): {ids}")
    if group.superseded:
        lines += ["", "Superseded (an older FINISHED run of the same algorithm and seed; not "
                  "counted):", ""]
        lines += [f"- {r.algorithm} seed {r.seed}: `{r.run_id}`"
                  for r in sorted(group.superseded, key=lambda r: (r.algorithm, r.run_id))]
    lines += ["", "</details>"]
    if excl:
        statuses = ", ".join(f"{s}: {c}" for s, c in sorted(group.excluded.items()))
        lines += ["", f"[^excluded]: {excl} non-FINISHED runs excluded ({statuses})."]
    return "\n".join(lines) + "\n"


def build_leaderboards(
    tracking_uri: str,
    experiment: str = "rlbench",
    out_dir: str | Path = "leaderboards",
    baseline: str = "grpo",
) -> list[Path]:
    """Query ``experiment`` at ``tracking_uri`` and write leaderboards under ``out_dir``.

    ``baseline`` is the algorithm paired differences are taken against, unless a run carries
    an ``rlbench.baseline`` tag naming its own. Returns the written files, sorted. Raises
    ``ValueError`` for an unknown experiment or one without FINISHED runs.
    """
    out = Path(out_dir)
    shown_uri = display_tracking_uri(tracking_uri, out.resolve().parent)
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None or exp.lifecycle_stage != "active":  # a deleted experiment is "unknown" too
        names = sorted(e.name for e in client.search_experiments(ViewType.ACTIVE_ONLY))
        raise ValueError(f"unknown MLflow experiment {experiment!r} at {shown_uri}; existing "
                         f"experiments: {', '.join(map(repr, names)) or '(none)'}")
    groups, n_other = _collect(client, exp.experiment_id)
    if not groups:
        raise ValueError(f"experiment {experiment!r} at {shown_uri} has no FINISHED runs "
                         f"({n_other} run(s) in other statuses)")
    command = (f"rlbench board --tracking-uri {shown_uri} --experiment {experiment} "
               f"--out {out.resolve().name} --baseline {baseline}")
    head = ["> Generated by `rlbench board` from MLflow queries — do not edit by hand.", "",
            f"- Experiment: `{experiment}`", f"- Tracking URI: `{shown_uri}`",
            f"- Command: `{command}`"]
    written: list[Path] = []
    index: list[str] = []
    for (task, variant, model), group in sorted(groups.items()):
        d = out / _safe(f"{task}-{variant}") / _safe(model)
        d.mkdir(parents=True, exist_ok=True)
        specs = _specs(group.runs)
        rows = _rows(group, specs, baseline)
        title = f"{task}-{variant} / {model}"
        (d / "leaderboard.md").write_text(_markdown(title, head, group, rows, specs))
        (d / "leaderboard.csv").write_text(_csv(rows, specs))
        prim = _primary(specs)
        ev = prim[0] if prim else "?"
        _plot(d / "pass_at_1.png", _curves(client, group.runs, f"eval/{ev}/pass_at_1"),
              f"{title}: {ev} pass@1", f"{ev} pass@1\n(mean over seeds; band = min–max)")
        _plot(d / "entropy.png", _curves(client, group.runs, "rollout/entropy"),
              f"{title}: rollout entropy",
              f"mean token entropy\n({_SMOOTH}-pt moving avg; band = min–max)", smooth=_SMOOTH)
        written += [d / n for n in ("leaderboard.md", "leaderboard.csv", "pass_at_1.png",
                                    "entropy.png")]
        best = rows[0]
        summary = (f"best **{best['algorithm']}**, {ev} pass@{prim[1]} "
                   f"{_pm(*best[f'{ev}/pass_at_{prim[1]}/final'])} over {best['n_seeds']} seeds"
                   if prim else "no final pass@k metrics")
        link = d.relative_to(out).as_posix() + "/leaderboard.md"
        index.append(f"- [{title}]({link}) — {summary} ({len(rows)} algorithms)")
    n_fin = sum(sum(len(s) for s in g.runs.values()) + len(g.superseded) for g in groups.values())
    readme = ["# rlbench leaderboards", "", *head,
              f"- Generated from {n_fin} finished runs ({n_other} run(s) in other statuses "
              "excluded).", "", *index]
    (out / "README.md").write_text("\n".join(readme) + "\n")
    written.append(out / "README.md")
    return sorted(written)
