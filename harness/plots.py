"""Leaderboard curves: a metric vs training step, one line per leaderboard row (mean over its
seeds) with a band spanning the seeds (min to max), rendered to a deterministic PNG (Agg canvas,
no timestamp or software metadata) so regenerating an unchanged store leaves the file as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["Curve", "align", "moving_avg", "plot_curves", "seed_curves"]


@dataclass(frozen=True)
class Curve:
    """One line: ``values[seed, step]`` at ``steps``, drawn in ``color``."""

    label: str
    steps: np.ndarray
    values: np.ndarray
    color: str


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


def seed_curves(rows: Iterable[tuple[str, str, list[str]]],
                history: Callable[[str], dict[int, float]]) -> list[Curve]:
    """Curves of ``rows`` = (label, color, run ids); ``history(run_id)`` is a run's
    {step: value}. Rows with nothing logged are left out."""
    out = []
    for label, color, run_ids in rows:
        aligned = align([history(rid) for rid in run_ids])
        if aligned is not None:
            out.append(Curve(label, aligned[0], aligned[1], color))
    return out


def plot_curves(path: Path, curves: list[Curve], title: str, ylabel: str,
                smooth: int = 1) -> None:
    """Mean over seeds (line) and min-max over seeds (band) of each curve vs step, each
    smoothed by a trailing ``smooth``-point moving average."""
    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for c in curves:
        mean, lo, hi = (moving_avg(v, smooth)
                        for v in (c.values.mean(0), c.values.min(0), c.values.max(0)))
        ax.plot(c.steps, mean, color=c.color, label=f"{c.label} (n={c.values.shape[0]})")
        if c.values.shape[0] > 1:
            ax.fill_between(c.steps, lo, hi, color=c.color, alpha=0.2, linewidth=0)
    if curves:
        ax.legend(loc="best", fontsize="small")
    else:
        ax.text(0.5, 0.5, "no data logged", ha="center", va="center", transform=ax.transAxes)
    ax.set(title=title, xlabel="training step", ylabel=ylabel)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})
