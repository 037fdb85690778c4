"""Leaderboard curves: a metric against training step (or tokens generated).

A board group gets, per pass@k eval set, an *overview* (every row in one axes, one line each)
and a *small multiple* (one panel per row that has a baseline, the row against that baseline
only, every panel on the same axes), each against training step and against tokens generated;
and overviews of the rollout metrics (reward, entropy, response length, gradient norm).
:func:`write_plots` writes them all for :mod:`harness.report.board`.

Each line is the mean over the row's seeds; its band is the Student-t interval over seeds at the
board's confidence, computed point by point as the tables compute one value, so a band that
leaves another line's band says what the tables would. With 18 rows the overview's bands hide
each other; the small multiples are where a row is read against its baseline. Evaluation curves
carry a marker at every plotted evaluation. Large numbers on an axis read ``50k``, ``1.5M``, with
at most six ticks, so token counts never run into each other. Rendering is deterministic (Agg
canvas, no timestamp or software metadata): an unchanged store gives the same PNG bytes.

Styles are fixed per algorithm across every board: an algorithm always has the colour
:func:`style` gives it (builtin algorithms a fixed entry of a 40-colour palette, others one picked
by a stable hash of the name), and the rows of one algorithm (variants, temperatures, learning
rates) differ by line style and marker, so 16+ rows stay distinguishable.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from harness.report.budget import TOKENS
from harness.report.stats import interval

if TYPE_CHECKING:
    from harness.report.budget import History
    from harness.report.config import BoardConfig
    from harness.report.tables import Row, Spec

__all__ = ["ALGORITHM_ORDER", "ROLLOUT_PLOTS", "Curve", "Style", "align", "moving_avg",
           "plot_curves", "plot_vs_baseline", "seed_curves", "short_number", "style",
           "token_curves", "write_plots"]

# Builtin algorithms in a fixed order: entry i of the palette is algorithm i's colour on every
# board. The palette is tab20's ten dark hues, then its ten light ones, then tab20b, so the first
# ten algorithms differ in hue. New algorithms go at the end, so no existing colour moves.
ALGORITHM_ORDER = ("grpo", "dr_grpo", "rloo", "maxrl", "dapo", "reinforce_pp", "cispo", "gppo",
                   "lpo_fwd", "lpo_rev", "agpo", "grpo_aem", "lope", "arbitrary_entropy", "arpo",
                   "aepo")
_PALETTE = [*colormaps["tab20"].colors[0::2], *colormaps["tab20"].colors[1::2],
            *colormaps["tab20b"].colors]
_LINESTYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))
_MARKERS = ("o", "s", "^", "D", "v", "P")
ROLLOUT_PLOTS = (  # file, metric, title, y label
    ("reward.png", "rollout/reward_mean", "training reward", "mean reward"),
    ("entropy.png", "rollout/entropy", "rollout entropy", "mean token entropy"),
    ("response_len.png", "rollout/response_len_mean", "response length",
     "mean response length (tokens)"),
    ("grad_norm.png", "actor/grad_norm", "pre-clip gradient norm", "gradient norm"),
)
TOKEN_TOLERANCE = 0.05  # token_curves: evaluations this share of a row's tokens apart pool
_BASELINE_COLOR = "black"  # the baseline in every small-multiple panel


@dataclass(frozen=True)
class Style:
    color: tuple[float, ...]
    linestyle: str | tuple
    marker: str


def style(algorithm: str, variant_index: int = 0) -> Style:
    """The colour of ``algorithm`` (the same on every board) and the line style and marker of
    its ``variant_index``-th row on this board."""
    if algorithm in ALGORITHM_ORDER:
        color = _PALETTE[ALGORITHM_ORDER.index(algorithm)]
    else:  # a plugin's algorithm: stable across boards and processes (not Python's hash())
        color = _PALETTE[zlib.crc32(algorithm.encode()) % len(_PALETTE)]
    i = variant_index % (len(_LINESTYLES) * len(_MARKERS))
    return Style(tuple(color), _LINESTYLES[i % len(_LINESTYLES)],
                 _MARKERS[(i // len(_LINESTYLES) + i) % len(_MARKERS)])


@dataclass(frozen=True)
class Curve:
    """One line: ``values[seed, point]`` at ``steps``; ``x[seed, point]`` when plotted against
    something else than the step (tokens generated)."""

    label: str
    steps: np.ndarray
    values: np.ndarray
    style: Style
    x: np.ndarray | None = None


# ---------------------------------------------------------------------------------- curves

def align(hists: list[dict[int, float]]) -> tuple[np.ndarray, np.ndarray] | None:
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


def moving_avg(y: np.ndarray, w: int) -> np.ndarray:
    """Trailing moving average over ``w`` points (fewer at the start)."""
    c = np.cumsum(np.insert(np.asarray(y, dtype=float), 0, 0.0))
    idx = np.arange(1, np.size(y) + 1)
    start = np.maximum(idx - max(1, w), 0)
    return (c[idx] - c[start]) / (idx - start)


def seed_curves(rows: Iterable[tuple[str, Style, list[str]]],
                history: Callable[[str], dict[int, float]]) -> list[Curve]:
    """Curves against training step of ``rows`` = (label, style, run ids); ``history(run_id)``
    is a run's {step: value}. Seeds are put on common steps by :func:`align`. Rows with nothing
    logged are left out."""
    out = []
    for label, st, run_ids in rows:
        aligned = align([history(rid) for rid in run_ids])
        if aligned is not None:
            out.append(Curve(label, *aligned, st))
    return out


def _pool(points: list[list[tuple[float, int, float]]],
          ) -> list[list[tuple[float, int, float]]]:
    """Groups of one (tokens, step, value) evaluation per seed (see :func:`token_curves`)."""
    shared = set.intersection(*({s for _, s, _ in pts} for pts in points))
    groups = [[next(p for p in pts if p[1] == step) for pts in points] for step in shared]
    rest = sorted((p, i) for i, pts in enumerate(points) for p in pts if p[1] not in shared)
    tol = TOKEN_TOLERANCE * max(t for pts in points for t, _, _ in pts)
    open_: dict[int, tuple[float, int, float]] = {}
    for p, i in [*rest, (None, -1)]:  # the sentinel closes the last group
        if p is None or (open_ and (i in open_ or p[0] - min(open_.values())[0] > tol)):
            if len(open_) == len(points):
                groups.append([open_[j] for j in range(len(points))])
            open_ = {}
        if p is not None:
            open_[i] = p
    return sorted(groups, key=lambda g: (float(np.mean([t for t, _, _ in g])), g))


def token_curves(rows: Iterable[tuple[str, Style, list[str]]],
                 history: Callable[[str], dict[int, float]],
                 tokens: Callable[[str], dict[int, float]]) -> list[Curve]:
    """Curves against tokens generated of ``rows`` = (label, style, run ids): ``history`` gives
    a run's {step: evaluation}, ``tokens`` its {step: tokens generated so far} (0 at step 0).

    Seeds generate different numbers of tokens, and runs may add evaluations where their
    tokens reach a mark (``trainer.eval_at_tokens``), so at different steps per seed. Every
    plotted point averages exactly one real evaluation of *every* seed, never an interpolated
    one (the trainer evaluates at the marks so that equal-compute values are read, not
    interpolated): first each step all seeds evaluated at, then the other evaluations pooled
    in token order into groups of one per seed no more than ``TOKEN_TOLERANCE`` (5%) of the
    row's largest token count apart; a group some seed misses is left out. A point is drawn at
    its evaluations' mean tokens; its band is the interval over those seeds' values. Runs that
    logged no tokens generated, and rows with nothing plotted, are left out."""
    out = []
    for label, st, run_ids in rows:
        points = []
        for rid in run_ids:
            if not tokens(rid):  # a run that logged no tokens generated has no x
                continue
            tok = {0: 0.0, **tokens(rid)}
            pts = [(tok[s], s, v) for s, v in sorted(history(rid).items())
                   if s in tok and not math.isnan(v)]
            if pts:
                points.append(pts)
        groups = _pool(points) if points else []
        if groups:
            x, steps, values = (np.array([[p[f] for p in g] for g in groups]).T
                                for f in range(3))
            out.append(Curve(label, steps.mean(0), values, st, x))
    return out


# ---------------------------------------------------------------------------------- drawing

def short_number(x: float, _pos: int | None = None) -> str:
    """A tick label: ``50k``, ``1.5M``, ``2B`` from a thousand on, plain (``0.25``, ``60``)
    below."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.4g}{suffix}"
    return f"{x:.4g}" if x else "0"


def _readable(ax: Axes, nbins: int) -> None:
    """At most ``nbins + 1`` round ticks on the x axis and ``nbins + 2`` on the y axis (whose
    labels stack, so they cannot collide), large numbers in short form."""
    ax.xaxis.set_major_locator(MaxNLocator(nbins=nbins, steps=[1, 2, 2.5, 5, 10]))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=nbins + 1, steps=[1, 2, 5, 10]))
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(FuncFormatter(short_number))


def _x(c: Curve) -> np.ndarray:
    return c.steps if c.x is None else c.x.mean(0)


def _draw(ax: Axes, c: Curve, color: object, linestyle: str | tuple, marker: str | None, *,
          smooth: int, confidence: float, label: str | None = None, alpha: float = 0.15,
          markersize: float = 4) -> None:
    """The seed mean as a line and, from two seeds, its per-point interval as a band."""
    values = np.array([moving_avg(v, smooth) for v in c.values])
    x = _x(c)
    ax.plot(x, values.mean(0), color=color, linestyle=linestyle, marker=marker,
            markersize=markersize, label=label)
    if values.shape[0] > 1:
        ivs = [interval(values[:, j], confidence) for j in range(values.shape[1])]
        ax.fill_between(x, [iv.low for iv in ivs], [iv.high for iv in ivs], color=color,
                        alpha=alpha, linewidth=0)


def _save(fig: Figure, path: Path) -> None:
    fig.savefig(path, format="png", metadata={"Software": None}, bbox_inches="tight")


def plot_curves(path: Path, curves: list[Curve], title: str, ylabel: str, *, smooth: int = 1,
                markers: bool = False, xlabel: str = "training step",
                confidence: float = 0.95) -> Figure:
    """The overview: every curve in one axes, its seed mean (line, legend ``label (n=seeds)``)
    and interval over seeds (band), each seed first smoothed by a trailing ``smooth``-point
    moving average; ``markers`` marks every point (evaluations). Returns the figure (already
    saved)."""
    fig = Figure(figsize=(7.2, 4.4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for c in curves:
        st = c.style
        _draw(ax, c, st.color, st.linestyle, st.marker if markers else None, smooth=smooth,
              confidence=confidence, label=f"{c.label} (n={c.values.shape[0]})")
    if curves:
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="x-small",
                  ncol=1 if len(curves) <= 18 else 2, frameon=False)
    else:
        ax.text(0.5, 0.5, "no data logged", ha="center", va="center", transform=ax.transAxes)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    _readable(ax, 5)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    _save(fig, path)
    return fig


def plot_vs_baseline(path: Path, rows: Sequence[Row], curves: list[Curve], title: str,
                     ylabel: str, *, smooth: int = 1, markers: bool = True,
                     xlabel: str = "training step", confidence: float = 0.95,
                     ncols: int = 4) -> Figure | None:
    """Small multiples: one panel per row of ``rows`` (in their order) whose baseline is a row
    with a curve, titled ``row vs baseline``, holding just two lines: the row in its colour
    (solid) and its baseline in black (dashed), each with its band; the title's second line
    says so. Every panel has the same x and y axes, so panels compare with each other too;
    ``curves`` are matched to rows by label (the row key). Returns the figure (already saved),
    or None, writing nothing, when no row has a baseline to draw."""
    by_label = {c.label: c for c in curves}
    pairs = [(by_label[r.key], by_label[r.baseline]) for r in rows
             if r.baseline and r.key in by_label and r.baseline in by_label]
    if not pairs:
        return None
    ncols = min(ncols, len(pairs))
    nrows = math.ceil(len(pairs) / ncols)
    fig = Figure(figsize=(max(2.7 * ncols + 0.6, 6.4), 2.3 * nrows + 1.0), dpi=100,
                 layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False)
    for i, ax in enumerate(grid.flat):
        if i >= len(pairs):
            fig.delaxes(ax)
            continue
        row, base = pairs[i]
        _draw(ax, base, _BASELINE_COLOR, "--", "o" if markers else None, smooth=smooth,
              confidence=confidence, alpha=0.12, markersize=2.5)
        _draw(ax, row, row.style.color, "-", row.style.marker if markers else None,
              smooth=smooth, confidence=confidence, alpha=0.25, markersize=3)
        ax.set_title(f"{row.label} (n={row.values.shape[0]})\nvs {base.label} "
                     f"(n={base.values.shape[0]})", fontsize=8)
        _readable(ax, 4)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if i + ncols >= len(pairs):  # nothing below it: its x tick labels are the column's
            ax.tick_params(labelbottom=True)
    fig.suptitle(f"{title}\ncolour, solid: the row; black, dashed: its baseline; band = "
                 f"{round(confidence * 100)}% interval over seeds", fontsize=10)
    fig.supxlabel(xlabel, fontsize=9)
    fig.supylabel(ylabel, fontsize=9)
    _save(fig, path)
    return fig


# ---------------------------------------------------------------------------------- a board

def _safe(name: str) -> str:
    """A file-name-safe form of an eval set's name (as the board names folders)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip(".") or "_"


def write_plots(history: History, d: Path, title: str, rows: list[Row], specs: list[Spec],
                cfg: BoardConfig) -> list[tuple[str, str]]:
    """Write a board group's PNGs into ``d`` and return (file name, alt text) of each, in the
    order the page shows them; a curve nothing was logged for is not drawn, and PNGs of an
    earlier build that are not written now are removed.

    Per pass@k spec ``<set>/pass_at_<k>``: the overview against step ``<set>-pass_at_<k>.png``
    (seeds aligned by :func:`align`) and its small multiple ``…-vs-baseline.png``, then both
    against tokens generated (``…-tokens.png``, ``…-tokens-vs-baseline.png``; points by
    :func:`token_curves`). Then the rollout overviews of :data:`ROLLOUT_PLOTS`, each seed
    smoothed by a ``cfg.smooth``-point moving average. ``history(run_id, metric)`` is a run's
    {step: value}; ``history.of(metric)`` the same for one metric."""
    band = f"band = {round(cfg.confidence * 100)}% interval over seeds, as in the tables"
    looks = [(r.key, style(r.algorithm, r.style_index), r.store_ids) for r in rows]
    written: list[tuple[str, str]] = []
    for s in specs:
        if s.kind != "pass":
            continue
        stem = f"{_safe(s.eval_set)}-pass_at_{s.k}"
        metric = history.of(f"eval/{s.name}")
        ylabel = f"{s.title}\n({band})"
        for suffix, curves, xlabel, vs in (
                ("", seed_curves(looks, metric), "training step", "step"),
                ("-tokens", token_curves(looks, metric, history.of(TOKENS)), "tokens generated",
                 "tokens generated")):
            if not curves:
                continue
            plot_curves(d / f"{stem}{suffix}.png", curves, f"{title}: {s.title}", ylabel,
                        markers=True, xlabel=xlabel, confidence=cfg.confidence)
            written.append((f"{stem}{suffix}.png", f"{s.title} vs {vs}"))
            name = f"{stem}{suffix}-vs-baseline.png"
            if plot_vs_baseline(d / name, rows, curves, f"{title}: {s.title}", s.title,
                                xlabel=xlabel, confidence=cfg.confidence):
                written.append((name, f"{s.title} vs {vs}, each row against its baseline"))
    for name, m, what, ylabel in ROLLOUT_PLOTS:
        curves = seed_curves(looks, history.of(m))
        if curves:
            plot_curves(d / name, curves, f"{title}: {what}", f"{ylabel}\n({cfg.smooth}-pt "
                        f"moving avg; {band})", smooth=cfg.smooth, confidence=cfg.confidence)
            written.append((name, f"{what} vs step"))
    for stale in sorted(d.glob("*.png")):  # curves of an earlier build that no longer exist
        if stale.name not in {n for n, _ in written}:
            stale.unlink()
    return written
