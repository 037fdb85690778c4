"""A board's curves (issue 31 item 7): readable token axes, one small-multiple panel per row
against its baseline, seeds that evaluate at different steps put together without
interpolation, and PNG bytes that depend on the runs only. Synthetic rows and a fake history;
no MLflow store."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from harness.report.budget import TOKENS
from harness.report.config import BoardConfig
from harness.report.plots import (
    plot_curves,
    plot_vs_baseline,
    seed_curves,
    short_number,
    style,
    token_curves,
    write_plots,
)
from harness.report.tables import Row, Run, Spec

SEEDS = ("0", "1", "2")
EVAL = "eval/heldout/pass_at_1"
SPECS = [Spec("heldout", "pass", 1)]
# row key -> (algorithm, baseline key, tokens per step, final pass@1)
ROWS = {"dapo": ("dapo", "grpo", 6500.0, 0.40), "grpo": ("grpo", "", 2000.0, 0.30),
        "rloo": ("rloo", "grpo", 2100.0, 0.32), "cispo": ("cispo", "", 1900.0, 0.25)}


class FakeHistory:
    """``history(run_id, metric)`` -> {step: value}, as harness.report.budget.History."""

    def __init__(self, data: dict[tuple[str, str], dict[int, float]]) -> None:
        self.data = data

    def __call__(self, run_id: str, metric: str) -> dict[int, float]:
        return self.data.get((run_id, metric), {})

    def of(self, metric: str):
        return lambda run_id: self(run_id, metric)


def _runs(marks: bool = True) -> tuple[list[Row], FakeHistory]:
    """Rows of three seeds, 60 steps; every run evaluates at steps 0, 30, 60 and, with
    ``marks``, once more where its tokens first reach 50k (a different step per seed)."""
    data: dict[tuple[str, str], dict[int, float]] = {}
    rows = []
    for key, (alg, base, per_step, level) in ROWS.items():
        runs = {}
        for seed in SEEDS:
            rid = f"{key}-{seed}"
            rate = per_step * (1 + 0.05 * int(seed))
            tokens = {s: rate * s for s in range(1, 61)}
            evals = [0, 30, 60] + ([min(s for s, t in tokens.items() if t >= 50_000)]
                                   if marks else [])
            rng = np.random.default_rng(int(seed) + 10 * len(key))
            data[rid, TOKENS] = tokens
            data[rid, EVAL] = {s: 0.1 + (level - 0.1) * s / 60 + rng.normal(0, 0.01)
                               for s in sorted(set(evals))}
            for m in ("rollout/reward_mean", "rollout/entropy"):
                data[rid, m] = {s: level * s / 60 + rng.normal(0, 0.02) for s in range(1, 61)}
            runs[seed] = Run(rid, alg, "", seed, "1.0", base, {})
        rows.append(Row(key, key, alg, "", "1.0", runs, baseline=base))
    return rows, FakeHistory(data)


def _looks(rows: list[Row]) -> list[tuple[str, object, list[str]]]:
    return [(r.key, style(r.algorithm, r.style_index), r.store_ids) for r in rows]


def _tick_labels(fig: Figure, ax, axis: str = "x") -> list:
    """The tick labels drawn on ``ax``'s ``axis`` (inside its view limits, with text)."""
    fig.canvas.draw()
    lo, hi = sorted(ax.get_xlim() if axis == "x" else ax.get_ylim())
    getter = ax.xaxis if axis == "x" else ax.yaxis
    return [tick.label1 for tick in getter.get_major_ticks()
            if lo <= tick.get_loc() <= hi and tick.label1.get_visible()
            and tick.label1.get_text()]


def _assert_short_and_apart(fig: Figure, ax) -> list[str]:
    labels = _tick_labels(fig, ax)
    texts = [t.get_text() for t in labels]
    assert 3 <= len(texts) <= 6, texts
    assert all(re.fullmatch(r"\d+(\.\d+)?[kMB]?", t) for t in texts), texts
    assert any(t[-1] in "kM" for t in texts), texts
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in labels]
    for (i, a), (j, b) in itertools.combinations(enumerate(boxes), 2):
        assert not a.overlaps(b), (texts[i], texts[j])
    return texts


# ---------------------------------------------------------------------------------- axes

def test_large_numbers_read_as_thousands_millions_and_billions():
    assert [short_number(x) for x in (0, 50_000, 100_000, 1_500_000, 2e9, 60, 0.25)] == \
        ["0", "50k", "100k", "1.5M", "2B", "60", "0.25"]


def test_token_axis_labels_are_short_and_do_not_overlap(tmp_path):
    # dapo reaches ~430k tokens: plain labels (50000, 100000, ...) ran into each other
    rows, history = _runs()
    curves = token_curves(_looks(rows), history.of(EVAL), history.of(TOKENS))
    fig = plot_curves(tmp_path / "t.png", curves, "t", "y", markers=True,
                      xlabel="tokens generated")
    assert _assert_short_and_apart(fig, fig.axes[0])[-1].endswith("k")
    panels = plot_vs_baseline(tmp_path / "v.png", rows, curves, "t", "y",
                              xlabel="tokens generated")
    for ax in panels.axes:
        if ax.xaxis.get_tick_params()["labelbottom"]:
            _assert_short_and_apart(panels, ax)


# ---------------------------------------------------------------------------------- panels

def test_small_multiples_hold_one_panel_per_row_with_a_baseline_of_two_lines_and_bands(
        tmp_path):
    rows, history = _runs()
    curves = seed_curves(_looks(rows), history.of(EVAL))
    fig = plot_vs_baseline(tmp_path / "v.png", rows, curves, "board", "pass@1")
    assert (tmp_path / "v.png").read_bytes()[:4] == b"\x89PNG"
    # grpo (the baseline) and cispo have no baseline: no panel of their own
    assert [ax.get_title().split(" (")[0] for ax in fig.axes] == ["dapo", "rloo"]
    by_key = {c.label: c for c in curves}
    for ax, key in zip(fig.axes, ("dapo", "rloo")):
        assert "vs grpo" in ax.get_title()
        assert len(ax.lines) == 2
        base, row = ax.lines
        assert base.get_color() == "black"
        assert tuple(row.get_color()) == style(key).color
        assert np.allclose(row.get_ydata(), by_key[key].values.mean(0))
        assert np.allclose(base.get_ydata(), by_key["grpo"].values.mean(0))
        assert len([c for c in ax.collections if isinstance(c, PolyCollection)]) == 2
    # one x range and one y range for every panel, so panels compare with each other
    assert len({ax.get_xlim() for ax in fig.axes}) == len({ax.get_ylim() for ax in fig.axes}) \
        == 1


def test_no_small_multiple_without_a_row_that_has_a_baseline(tmp_path):
    rows, history = _runs()
    rows = [r for r in rows if not r.baseline]
    curves = seed_curves(_looks(rows), history.of(EVAL))
    assert plot_vs_baseline(tmp_path / "v.png", rows, curves, "t", "y") is None
    assert not (tmp_path / "v.png").exists()


# ---------------------------------------------------------------------------------- seeds

def test_token_points_average_one_real_evaluation_of_every_seed():
    rows, history = _runs()
    (dapo,) = token_curves(_looks(rows[:1]), history.of(EVAL), history.of(TOKENS))
    ids = rows[0].store_ids
    evals = [history(rid, EVAL) for rid in ids]
    marks = [sorted(set(e) - {0, 30, 60})[0] for e in evals]
    assert len(set(marks)) > 1  # the seeds reached 50k tokens at different steps
    # step 0, each seed's 50k evaluation, steps 30 and 60: nothing interpolated
    expected = [[e[s] for e, s in zip(evals, steps)]
                for steps in ([0] * 3, marks, [30] * 3, [60] * 3)]
    assert np.array_equal(dapo.values, np.array(expected).T)
    assert np.allclose(dapo.x[:, 1], [history(r, TOKENS)[m] for r, m in zip(ids, marks)])
    assert np.all(np.diff(dapo.x.mean(0)) > 0)
    # against step, only the steps every seed evaluated at
    (by_step,) = seed_curves(_looks(rows[:1]), history.of(EVAL))
    assert list(by_step.steps) == [0, 30, 60]


def test_an_evaluation_some_seed_lacks_is_not_plotted_against_tokens():
    rows, history = _runs()
    first, *_ = rows[0].store_ids
    history.data[first, EVAL][59] = 0.9  # one seed alone evaluates near its end
    (dapo,) = token_curves(_looks(rows[:1]), history.of(EVAL), history.of(TOKENS))
    assert dapo.values.shape == (3, 4) and 0.9 not in dapo.values


# ---------------------------------------------------------------------------------- a board

def test_write_plots_names_the_overviews_and_small_multiples_and_removes_stale(tmp_path):
    rows, history = _runs()
    (tmp_path / "old-curve.png").write_bytes(b"stale")
    written = write_plots(history, tmp_path, "board", rows, SPECS, BoardConfig())
    assert [n for n, _ in written] == [
        "heldout-pass_at_1.png", "heldout-pass_at_1-vs-baseline.png",
        "heldout-pass_at_1-tokens.png", "heldout-pass_at_1-tokens-vs-baseline.png",
        "reward.png", "entropy.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for n, _ in written)
    no_base = [r for r in rows if not r.baseline]
    names = [n for n, _ in write_plots(history, tmp_path, "board", no_base, SPECS,
                                       BoardConfig())]
    assert not any("vs-baseline" in n for n in names)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)


@pytest.mark.parametrize("marks", [True, False])
@pytest.mark.slow
def test_an_unchanged_store_gives_identical_png_bytes(tmp_path, marks):
    outs = []
    for name in ("a", "b"):
        rows, history = _runs(marks)
        d = tmp_path / name
        d.mkdir()
        written = write_plots(history, d, "board", rows, SPECS, BoardConfig())
        outs.append((written, {p.name: p.read_bytes() for p in sorted(d.iterdir())}))
    assert outs[0] == outs[1]
    assert len(outs[0][1]) == 6


@pytest.mark.slow
def test_a_different_store_gives_different_png_bytes(tmp_path):
    """The check above compares real renderings: a changed value changes the bytes."""
    rows, history = _runs()
    write_plots(history, tmp_path, "board", rows, SPECS, BoardConfig())
    before = (tmp_path / "heldout-pass_at_1-vs-baseline.png").read_bytes()
    history.data[rows[0].store_ids[0], EVAL][60] += 0.05
    write_plots(history, tmp_path, "board", rows, SPECS, BoardConfig())
    assert (tmp_path / "heldout-pass_at_1-vs-baseline.png").read_bytes() != before


def test_alt_texts_say_what_each_curve_is_against(tmp_path):
    rows, history = _runs()
    alts = dict(write_plots(history, tmp_path, "board", rows, SPECS, BoardConfig()))
    assert alts["heldout-pass_at_1-tokens-vs-baseline.png"] == \
        "heldout pass@1 vs tokens generated, each row against its baseline"
    assert alts["reward.png"] == "training reward vs step"
