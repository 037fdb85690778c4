"""Leaderboard generator: MLflow runs -> markdown/CSV tables, PNG curves and a leaderboard run in
MLflow (``rlbench board``).

Every number on a leaderboard must trace back to logged runs, so nothing here is typed by hand:
``build_leaderboards`` queries the MLflow tracking store, keeps FINISHED training runs only (others
are counted in a footnote; leaderboard runs, ``rlbench.kind=leaderboard``, are skipped;
``rlbench eval`` runs, ``rlbench.kind=eval``, are kept, labelled ``<algorithm>@eval`` by their
``rlbench.variant`` tag), groups them by (task, task_variant, model) and writes one directory
per group with

- ``leaderboard.md``/``.csv``: one row per algorithm (``algorithm@variant`` when the run carries a
  variant, see ``conf/board/default.yaml``) and sampling temperature; per eval set pass@1, pass@k
  for every logged k, mean@n and maj@k where logged, as mean ± 95% interval over seeds (Student-t,
  a seeded percentile bootstrap from 10 seeds on); paired differences against the row's baseline on
  shared seeds (``†`` when the interval excludes 0); change since step 0; cost (tokens generated
  and trained, wall time, peak memory);
- one PNG per curve (``<set>-pass_at_<k>.png``, ``reward.png``, ``entropy.png``,
  ``response_len.png``): mean over seeds with a min-max band;

then an index ``README.md`` (command, git commit, date) and, per group, a leaderboard run in the
same MLflow experiment (``harness.board_mlflow``). Files other than the README's date line are
deterministic (sorted, seeded, no timestamps), so regenerating an unchanged store gives a clean
``git diff``. ``SOURCE_DATE_EPOCH`` fixes the date too.

Run conventions read here (written by the trainer): tags ``rlbench.{algorithm,task,task_variant,
model,seed,temperature,baseline,kind}``; summary metrics ``final/<set>/{pass,mean,maj}_at_<k>``,
``start/<set>/...``, ``final/{steps,tokens_total,tokens_trained,wall_s,peak_mem_mb,
peak_gpu_mem_mb}``; step metrics ``eval/<set>/pass_at_<k>`` and ``rollout/{reward_mean,entropy,
response_len_mean}``. The "final token entropy" column is the mean of ``rollout/entropy`` over each
run's last ``final_window`` logged steps (board config), read from the metric history.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import os
import re
import shlex
import subprocess
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from mlflow.entities import Run as MlflowRun
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from harness.board_mlflow import KIND_TAG, log_leaderboard
from harness.board_tables import (
    COSTS,
    DYNAMICS,
    Row,
    Run,
    Spec,
    cell,
    footer,
    late_means,
    notes_text,
    quality_table,
    render_csv,
    render_markdown,
    table,
)
from harness.plots import plot_curves, seed_curves
from harness.stats import interval, paired_interval

__all__ = ["BoardConfig", "build_leaderboards", "display_tracking_uri", "load_config"]

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "conf" / "board" / "default.yaml"
_PAGE = 1000  # search_runs page size
_SPEC_RE = re.compile(r"^final/(.+)/(pass|mean|maj)_at_(\d+)$")
_SECRET_RE = re.compile(r"pass|secret|token|key|cred|auth|sig", re.IGNORECASE)
_ROLLOUT_PLOTS = (  # file, metric, title, y label
    ("reward.png", "rollout/reward_mean", "training reward", "mean reward"),
    ("entropy.png", "rollout/entropy", "rollout entropy", "mean token entropy"),
    ("response_len.png", "rollout/response_len_mean", "response length",
     "mean response length (tokens)"),
)


# ---------------------------------------------------------------------------------- config

@dataclass(frozen=True)
class BoardConfig:
    """The pairing and statistics of a leaderboard (``conf/board/default.yaml``)."""

    baseline: str = "grpo"
    pairs: dict[str, str] = field(default_factory=dict)
    variant: tuple[str, ...] = ("tags.rlbench.variant",)
    confidence: float = 0.95
    bootstrap_min_n: int = 10
    bootstrap_resamples: int = 10_000
    bootstrap_seed: int = 0
    smooth: int = 5
    final_window: int = 10
    source: str = "(built-in defaults)"


def load_config(path: str | Path | None = None) -> BoardConfig:
    """Read a board config (yaml); ``None`` reads ``conf/board/default.yaml`` when it exists.
    Unknown keys and malformed values raise ``ValueError`` naming them."""
    from omegaconf import OmegaConf

    explicit = path is not None
    p = Path(path) if explicit else DEFAULT_CONFIG
    if not p.is_file():
        if explicit:
            raise ValueError(f"board config {str(p)!r} not found")
        return BoardConfig()
    raw = OmegaConf.to_container(OmegaConf.load(p), resolve=True) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"board config {p.name}: expected a mapping")
    valid = {f for f in BoardConfig.__dataclass_fields__ if f != "source"}
    unknown = sorted(set(raw) - valid)
    if unknown:
        raise ValueError(f"board config {p.name}: unknown key(s) {', '.join(unknown)}; valid: "
                         f"{', '.join(sorted(valid))}")
    pairs = raw.get("pairs") or {}
    if not isinstance(pairs, dict) or not all(isinstance(v, str) for v in pairs.values()):
        raise ValueError(f"board config {p.name}: pairs must map a row name to a baseline name")
    variant = raw.get("variant", list(BoardConfig.variant))
    variant = [variant] if isinstance(variant, str) else list(variant or [])
    bad = [v for v in variant if not str(v).startswith(("tags.", "params."))]
    if bad:
        raise ValueError(f"board config {p.name}: variant entries must start with 'tags.' or "
                         f"'params.', got {bad}")
    cfg = BoardConfig(**{**{k: v for k, v in raw.items() if k not in ("pairs", "variant")},
                         "pairs": {str(k): v for k, v in pairs.items()},
                         "variant": tuple(map(str, variant)), "source": _shown_path(p)})
    if not 0.0 < cfg.confidence < 1.0:
        raise ValueError(f"board config {p.name}: confidence must be in (0, 1)")
    if cfg.final_window < 1:
        raise ValueError(f"board config {p.name}: final_window must be >= 1")
    return cfg


def _shown_path(p: Path) -> str:
    try:
        return p.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return p.name


# ---------------------------------------------------------------------------------- tracking URI

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


# ---------------------------------------------------------------------------------- collection

@dataclass
class _Group:
    runs: dict[tuple[str, str, str], dict[str, Run]] = field(default_factory=dict)
    superseded: list[Run] = field(default_factory=list)
    excluded: Counter[str] = field(default_factory=Counter)  # status -> count

    @property
    def n_used(self) -> int:
        return sum(len(s) for s in self.runs.values())


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
    return sorted(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id))


def _group_key(run: MlflowRun) -> tuple[str, str, str]:
    t = run.data.tags
    return tuple(t.get(f"rlbench.{k}", "unknown") for k in ("task", "task_variant", "model"))


def _variant(run: MlflowRun, keys: tuple[str, ...]) -> str:
    values = []
    for key in keys:
        kind, _, name = key.partition(".")
        value = (run.data.tags if kind == "tags" else run.data.params).get(name, "")
        if value:
            values.append(value)
    return ",".join(values)


def _collect(client: MlflowClient, exp_id: str, cfg: BoardConfig,
             ) -> tuple[dict[tuple[str, str, str], _Group], int]:
    """FINISHED training runs grouped; one run per (row, seed): the latest started, the rest
    listed as superseded. Returns (groups, number of non-finished training runs)."""
    groups: dict[tuple[str, str, str], _Group] = defaultdict(_Group)
    for r in _search(client, exp_id, "attributes.status = 'FINISHED'"):
        t = r.data.tags
        run = Run(r.info.run_id, t.get("rlbench.algorithm", "unknown"), _variant(r, cfg.variant),
                  t.get("rlbench.seed", "?"), t.get("rlbench.temperature", ""),
                  t.get("rlbench.baseline", ""), dict(r.data.metrics))
        group = groups[_group_key(r)]
        by_seed = group.runs.setdefault((run.algorithm, run.variant, run.temperature), {})
        if run.seed in by_seed:  # runs are sorted by start time: the later one wins
            group.superseded.append(by_seed[run.seed])
        by_seed[run.seed] = run
    others = _search(client, exp_id, "attributes.status != 'FINISHED'")
    for r in others:
        if _group_key(r) in groups:
            groups[_group_key(r)].excluded[r.info.status] += 1
    return dict(groups), len(others)


# ---------------------------------------------------------------------------------- rows

def _specs(group: _Group) -> list[Spec]:
    found = {Spec(m.group(1), m.group(2), int(m.group(3)))
             for by_seed in group.runs.values() for r in by_seed.values() for key in r.metrics
             if (m := _SPEC_RE.match(key))}
    return sorted(found, key=Spec.sort_key)


def _primary(specs: list[Spec]) -> Spec | None:
    """The first eval set (by name) at pass@1, else its smallest pass@k, else its first metric."""
    if not specs:
        return None
    first = [s for s in specs if s.eval_set == specs[0].eval_set]
    return min(first, key=lambda s: (s.kind != "pass", s.k != 1, s.k))


def _per_seed(runs: dict[str, Run], key: str) -> dict[str, float]:
    return {s: r.metrics[key] for s, r in runs.items()
            if key in r.metrics and not math.isnan(r.metrics[key])}


def _make_rows(group: _Group) -> list[Row]:
    labels = Counter(f"{a}@{v}" if v else a for a, v, _ in group.runs)
    rows = []
    for i, ((alg, var, temp), runs) in enumerate(sorted(group.runs.items())):
        label = f"{alg}@{var}" if var else alg
        key = label if labels[label] == 1 else f"{label} T={temp or '?'}"
        rows.append(Row(key, label, alg, var, temp, runs, color=f"C{i % 10}"))
    return rows


def _pair(rows: list[Row], cfg: BoardConfig, default: str) -> None:
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
    opts = (cfg.confidence, cfg.bootstrap_min_n, cfg.bootstrap_resamples, cfg.bootstrap_seed)
    by_key = {r.key: r for r in rows}
    for row in rows:
        for s in specs:
            fin = _per_seed(row.runs, f"final/{s.name}")
            start = _per_seed(row.runs, f"start/{s.name}")
            row.final[s.name] = interval(fin.values(), *opts)
            row.start[s.name] = interval(start.values(), *opts)
            row.delta[s.name] = interval([fin[k] - start[k] for k in fin if k in start], *opts)
            if row.baseline:
                base = _per_seed(by_key[row.baseline].runs, f"final/{s.name}")
                row.vs[s.name] = paired_interval(fin, base, *opts)
        for d in DYNAMICS:
            late = _per_seed(row.runs, f"final/{d.key}")
            row.final[d.key] = interval(late.values(), *opts)
            if row.baseline:
                base = _per_seed(by_key[row.baseline].runs, f"final/{d.key}")
                row.vs[d.key] = paired_interval(late, base, *opts)
        for c in COSTS:
            row.cost[c.key] = interval(_per_seed(row.runs, f"final/{c.key}").values(), *opts)


def _rank(rows: list[Row], prim: Spec | None) -> list[Row]:
    def order(row: Row) -> tuple[bool, float, str]:
        m = row.final[prim.name].mean if prim else math.nan
        return (math.isnan(m), -m if not math.isnan(m) else 0.0, row.key)

    return sorted(rows, key=order)


# ---------------------------------------------------------------------------------- pages

def _plots(client: MlflowClient, d: Path, title: str, rows: list[Row], specs: list[Spec],
           smooth: int) -> list[tuple[str, str]]:
    """Write the group's PNGs (only curves something was logged for); (file, alt text)."""
    items = [(f"{_safe(s.eval_set)}-pass_at_{s.k}.png", f"eval/{s.name}", f"{s.title}",
              f"{s.title}\n(mean over seeds; band = min–max)", 1)
             for s in specs if s.kind == "pass"]
    items += [(f, m, t, f"{y}\n({smooth}-pt moving avg; band = min–max)", smooth)
              for f, m, t, y in _ROLLOUT_PLOTS]
    written = []
    for name, metric, what, ylabel, w in items:
        def history(run_id: str, metric: str = metric) -> dict[int, float]:
            hist = sorted(client.get_metric_history(run_id, metric),
                          key=lambda m: (m.step, m.timestamp))
            return {m.step: m.value for m in hist}  # a step logged twice: the last write wins

        curves = seed_curves(((r.key, r.color, [rid for _, rid in r.run_ids]) for r in rows),
                             history)
        if curves:
            plot_curves(d / name, curves, f"{title}: {what}", ylabel, smooth=w)
            written.append((name, f"{what} vs step"))
    for stale in sorted(d.glob("*.png")):  # curves of an earlier build that no longer exist
        if stale.name not in {n for n, _ in written}:
            stale.unlink()
    return written


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip(".") or "_"


def _git_commit(out: Path) -> str:
    """HEAD of the checkout rlbench runs from, flagged when tracked files (outside ``out``)
    differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        exclude = []
        with contextlib.suppress(ValueError):  # ``out`` outside the checkout: nothing to exclude
            exclude = [f":(exclude){out.resolve().relative_to(REPO).as_posix()}"]
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", *exclude)
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return head + (" (with uncommitted changes)" if dirty else "")


def _today() -> str:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    now = (_dt.datetime.fromtimestamp(int(epoch), _dt.timezone.utc) if epoch
           else _dt.datetime.now(_dt.timezone.utc))
    return now.strftime("%Y-%m-%d")


# ---------------------------------------------------------------------------------- build

def build_leaderboards(
    tracking_uri: str,
    experiment: str = "rlbench",
    out_dir: str | Path = "leaderboards",
    baseline: str | None = None,
    config: str | Path | None = None,
    log_to_mlflow: bool = True,
) -> list[Path]:
    """Query ``experiment`` at ``tracking_uri`` and write leaderboards under ``out_dir``.

    ``config`` is the board config (pairings, interval settings; default
    ``conf/board/default.yaml``); ``baseline``, when given, replaces its default baseline.
    ``log_to_mlflow`` also logs each leaderboard as a run of the experiment, replacing the
    previous one. Returns the written files, sorted. Raises ``ValueError`` for an unknown
    experiment, one without FINISHED runs, or a bad config.
    """
    cfg = load_config(config)
    default = baseline if baseline is not None else cfg.baseline
    out = Path(out_dir)
    shown_uri = display_tracking_uri(tracking_uri, out.resolve().parent)
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None or exp.lifecycle_stage != "active":  # a deleted experiment is "unknown" too
        names = sorted(e.name for e in client.search_experiments(ViewType.ACTIVE_ONLY))
        raise ValueError(f"unknown MLflow experiment {experiment!r} at {shown_uri}; existing "
                         f"experiments: {', '.join(map(repr, names)) or '(none)'}")
    groups, n_other = _collect(client, exp.experiment_id, cfg)
    if not groups:
        raise ValueError(f"experiment {experiment!r} at {shown_uri} has no FINISHED runs "
                         f"({n_other} run(s) in other statuses)")
    args = ["--tracking-uri", shown_uri, "--experiment", experiment, "--out", out.resolve().name]
    args += ["--baseline", baseline] if baseline is not None else []
    args += ["--config", cfg.source] if config is not None else []
    args += [] if log_to_mlflow else ["--no-mlflow"]
    command = "rlbench board " + " ".join(map(shlex.quote, args))
    head = ["> Generated by `rlbench board` from MLflow queries — do not edit by hand.", "",
            f"- Experiment: `{experiment}`", f"- Tracking URI: `{shown_uri}`",
            f"- Command: `{command}`"]
    commit, date = _git_commit(out), _today()
    notes = notes_text(cfg.confidence, cfg.bootstrap_min_n, cfg.bootstrap_resamples,
                       cfg.bootstrap_seed, cfg.source, default, cfg.final_window)
    written: list[Path] = []
    index: list[str] = []
    for (task, variant, model), group in sorted(groups.items()):
        d = out / _safe(f"{task}-{variant}") / _safe(model)
        d.mkdir(parents=True, exist_ok=True)
        specs = _specs(group)
        prim = _primary(specs)
        rows = _make_rows(group)
        _pair(rows, cfg, default)
        late_means(client, rows, cfg.final_window)
        _fill(rows, specs, cfg)
        rows = _rank(rows, prim)
        title = f"{task}-{variant} / {model}"
        n_sup, excl = len(group.superseded), sum(group.excluded.values())
        page_head = [*head, f"- Pairing config: `{cfg.source}`; default baseline `{default}`.",
                     f"- Generated from {group.n_used + n_sup} finished runs"
                     + (f" ({n_sup} superseded)" if n_sup else "")
                     + ("; runs in other statuses excluded[^excluded]." if excl else "."),
                     f"- Primary metric: {prim.title} (final)." if prim else
                     "- No `final/<set>/pass_at_<k>` metrics were logged."]
        plots = _plots(client, d, title, rows, specs, cfg.smooth)
        md = render_markdown(title, page_head, rows, specs, plots, notes,
                             footer(rows, group.superseded, group.excluded))
        records = table(rows, specs, cfg.confidence)
        (d / "leaderboard.md").write_text(md)
        (d / "leaderboard.csv").write_text(render_csv(records))
        files = [d / "leaderboard.md", d / "leaderboard.csv", *(d / n for n, _ in plots)]
        written += files
        best = rows[0]
        summary = (f"best **{best.key}**, {prim.title} {cell(best.final[prim.name])}"
                   if prim else "no final pass@k metrics")
        link = d.relative_to(out).as_posix() + "/leaderboard.md"
        index += [f"- [{title}]({link}) — {summary}; {len(rows)} rows, "
                  f"{group.n_used} runs",
                  f"  - made by `{command}` at commit `{commit}` on {date}"]
        if log_to_mlflow:
            note = "\n".join([f"# Leaderboard {title}", "", *page_head[2:], "",
                              *quality_table(rows, specs), "",
                              "Artifacts: leaderboard.md, leaderboard.csv, "
                              "leaderboard_table.json, runs.json, PNG curves."])
            log_leaderboard(
                client, exp.experiment_id, name=f"leaderboard {task}-{variant}/{model}",
                group_tags={"rlbench.task": task, "rlbench.task_variant": variant,
                            "rlbench.model": model},
                files=files, records=records, row_runs={r.key: r.run_ids for r in rows},
                info={"experiment": experiment, "command": command, "commit": commit,
                      "baseline": default, "config": cfg.source,
                      "primary": prim.name if prim else ""},
                note=note)
    n_fin = sum(g.n_used + len(g.superseded) for g in groups.values())
    readme = ["# rlbench leaderboards", "", *head, f"- Code: commit `{commit}`",
              f"- Date: {date} (UTC)",
              f"- Generated from {n_fin} finished runs ({n_other} run(s) in other statuses "
              "excluded).", "", *index]
    (out / "README.md").write_text("\n".join(readme) + "\n")
    written.append(out / "README.md")
    return sorted(written)

