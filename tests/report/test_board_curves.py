"""Response curves on a board (issue 36; harness/report/curves.py): arbitrary-entropy PO's final
token entropy against its target, declared in the board config. On synthetic MLflow runs whose
entropy follows the target with a known slope (or ignores it), the page's slope must be the
seed-blocked OLS slope recomputed here by hand, its interval must exclude 0 exactly when the
entropy moves, and the PNG must be written; a curve row mixing two targets is refused."""

from __future__ import annotations

import csv
import functools

import numpy as np
import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
from scipy import stats

from harness.report.board import build_leaderboards as _build
from harness.report.config import BoardError, load_config
from harness.tracking import open_client

build_leaderboards = functools.partial(_build, allow_dirty=True, log_to_mlflow=False,
                                       export=False)
TARGETS = (0.1, 0.25, 0.6, 0.9)
SEEDS = (0, 1, 2, 3, 4)
SEED_SHIFT = (0.02, -0.01, 0.0, 0.015, -0.025)  # every row of a seed alike: blocked out
JITTER = np.random.default_rng(3).normal(0.0, 0.01, (len(TARGETS) + 1, len(SEEDS)))
CURVE = """curves:
  entropy_targets:
    - name: entropy_vs_target
      rows: arbitrary_entropy
      x: algorithm.rollout.target_entropy
      y: token_entropy
      baseline: grpo
      identity: true
"""


def _entropy(slope: float, i: int, j: int, target: float | None) -> float:
    """Row ``i`` (the last: grpo, no target), seed ``j``: 0.35 + slope (target - 0.35)."""
    moved = 0.0 if target is None else slope * (target - 0.35)
    return 0.35 + moved + SEED_SHIFT[j] + JITTER[i, j]


def _experiment(client: MlflowClient, name: str, root, slope: float, odd: str = ""):
    """``odd``: "mixed" gives seed 0 of the first row another target; "missing" leaves the
    first row's runs without the key; "twins" makes the 0.9 row's runs those of the 0.6 row
    (a controller that treats both targets alike on every step)."""
    exp = client.create_experiment(name, artifact_location=(root / name).as_uri())
    rows = [*((f"arbitrary_entropy@{t:g}", t) for t in TARGETS), ("grpo", None)]
    n = 0
    for i, (label, target) in enumerate(rows):
        alg, _, variant = label.partition("@")
        for j, seed in enumerate(SEEDS):
            tags = {"rlbench.algorithm": alg, "rlbench.task": "countdown",
                    "rlbench.task_variant": "tiny", "rlbench.model": "tiny",
                    "rlbench.temperature": "1.0", "rlbench.seed": str(seed),
                    "rlbench.sweep": "entropy_targets"}
            params = [Param("seed", str(seed)), Param("algorithm.name", alg)]
            if variant:
                tags["rlbench.variant"] = variant
                x = 0.5 if odd == "mixed" and i == 0 and j == 0 else target
                if not (odd == "missing" and i == 0):
                    params.append(Param("algorithm.rollout.target_entropy", str(x)))
            rid = client.create_run(exp, start_time=n, tags=tags).info.run_id
            n += 1
            h = _entropy(slope, 2 if odd == "twins" and i == 3 else i, j,
                         TARGETS[2] if odd == "twins" and i == 3 else target)
            client.log_batch(rid, params=params, metrics=[
                Metric("eval/heldout/pass_at_1", 0.2, 0, 20),
                Metric("final/heldout/pass_at_1", 0.2, 0, 20),
                # the last ten logged steps average to h (the board's final token entropy)
                *(Metric("rollout/entropy", h + (0.001 if s % 2 else -0.001), 0, s)
                  for s in range(1, 21))])
            client.set_terminated(rid, "FINISHED")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("curves")
    uri = f"sqlite:///{root / 'mlruns.db'}"
    client = open_client(uri)
    _experiment(client, "follows", root, slope=0.5)
    _experiment(client, "ignores", root, slope=0.0)
    _experiment(client, "mixed", root, slope=0.5, odd="mixed")
    _experiment(client, "missing", root, slope=0.5, odd="missing")
    _experiment(client, "twins", root, slope=0.5, odd="twins")
    (root / "curve.yaml").write_text(CURVE)
    return root, uri


def _page(store, experiment: str) -> tuple[str, dict]:
    root, uri = store
    out = root / f"board_{experiment}"
    build_leaderboards(uri, experiment, out, config=root / "curve.yaml")
    page = out / "countdown-tiny" / "tiny"
    with open(page / "leaderboard.csv", newline="") as f:
        rows = {r["row"]: r for r in csv.DictReader(f)}
    return (page / "leaderboard.md").read_text(), {"dir": page, "rows": rows}


def _slope_by_hand(slope: float) -> tuple[float, float, float]:
    """OLS of entropy on target with a seed fixed effect, by the normal equations: the slope
    is the within-seed regression on demeaned target and entropy; its SE from the residual
    variance on (R*S - S - 1) degrees of freedom."""
    y = np.array([[_entropy(slope, i, j, t) for j in range(len(SEEDS))]
                  for i, t in enumerate(TARGETS)])
    x = np.repeat(np.array(TARGETS)[:, None], len(SEEDS), axis=1)
    xd, yd = x - x.mean(0), y - y.mean(0)  # within seed
    b = float((xd * yd).sum() / (xd ** 2).sum())
    resid = yd - b * xd
    df = y.size - len(SEEDS) - 1
    se = float(np.sqrt((resid ** 2).sum() / df / (xd ** 2).sum()))
    return b, se, df


@pytest.mark.parametrize(("experiment", "slope"), [("follows", 0.5), ("ignores", 0.0)])
def test_the_slope_is_the_seed_blocked_regression_and_excludes_zero_only_when_it_moves(
        store, experiment, slope):
    md, page = _page(store, experiment)
    b, se, df = _slope_by_hand(slope)
    low, high = b - stats.t.ppf(0.975, df) * se, b + stats.t.ppf(0.975, df) * se
    mde = (stats.t.ppf(0.975, df) + stats.t.ppf(0.8, df)) * se
    line = next(ln for ln in md.splitlines() if ln.startswith("- Slope:"))
    assert line.startswith(f"- Slope: **{b:+.3f}** [{low:+.3f}, {high:+.3f}], SE {se:.3f}, ")
    assert f"MDE {mde:.3f} (20 runs, {df} residual df)" in line
    assert (low > 0) == (experiment == "follows")
    assert "## Response curves" in md and "![entropy_vs_target](entropy_vs_target.png)" in md
    png = page["dir"] / "entropy_vs_target.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    # each target's row and the baseline, in target order
    table = md.split("### entropy_vs_target", 1)[1].split("- Slope", 1)[0]
    order = [ln.split("|")[2].strip() for ln in table.splitlines() if ln.startswith("| ")][1:]
    assert order == [f"arbitrary_entropy@{t:g}" for t in TARGETS] + ["grpo (baseline)"]


@pytest.mark.slow
def test_rows_whose_runs_are_identical_are_named_beside_the_slope(store):
    """Two targets the controller treats alike give bit-identical runs: the page names them,
    since the fit counts them as separate points (an optimistic SE); distinct rows, none."""
    md, _ = _page(store, "twins")
    assert ("- Identical in every run: arbitrary_entropy@0.6 ≡ arbitrary_entropy@0.9. Their "
            "runs computed the same thing") in md
    assert "Identical in every run" not in _page(store, "follows")[0]


def test_a_curve_row_without_one_value_of_its_key_is_refused(store):
    # two targets in one row: the board's one-configuration rule refuses it first; a row whose
    # runs lack the key: the curve refuses it
    with pytest.raises(BoardError, match=r"row 'arbitrary_entropy@0.1' would mix configurations"):
        _page(store, "mixed")
    with pytest.raises(BoardError, match=r"curve entropy_vs_target: row 'arbitrary_entropy@0.1' "
                                         r"has no single numeric algorithm.rollout.target"):
        _page(store, "missing")


@pytest.mark.slow
def test_a_board_draws_only_the_curves_its_runs_sweep_declares(store):
    root, uri = store
    (root / "other.yaml").write_text(CURVE.replace("entropy_targets:", "rollout_testbed:"))
    (root / "none.yaml").write_text("baseline: grpo\n")
    for name, config in (("no_curves", root / "none.yaml"), ("other_sweep", root / "other.yaml")):
        out = root / name
        build_leaderboards(uri, "follows", out, config=config)
        md = (out / "countdown-tiny" / "tiny" / "leaderboard.md").read_text()
        assert "## Response curves" not in md
        assert not (out / "countdown-tiny" / "tiny" / "entropy_vs_target.png").exists()
    # the shipped default (conf/board/default.yaml) declares the entropy testbed's curve
    out = root / "default"
    build_leaderboards(uri, "follows", out)
    assert "### entropy_vs_target" in (out / "countdown-tiny" / "tiny" / "leaderboard.md"
                                      ).read_text()


@pytest.mark.parametrize("bad", ["curves: [{name: a, rows: b, x: c, y: d}]",
                                 "curves: {s: {name: x}}",
                                 "curves: {s: [{name: a, rows: b, x: c}]}",
                                 "curves: {s: [{name: a, rows: b, x: c, y: d, colour: red}]}",
                                 "curves: {s: [{name: a, rows: b, x: c, y: d}, "
                                 "{name: a, rows: e, x: f, y: g}]}"])
def test_a_malformed_curves_key_names_what_it_takes(tmp_path, bad):
    p = tmp_path / "board.yaml"
    p.write_text(bad + "\n")
    with pytest.raises(BoardError, match=r"curves must map a sweep name|two curves named alike"):
        load_config(p)
