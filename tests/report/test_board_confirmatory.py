"""A confirmatory board (issue 30): a complete design (grpo, dapo and drgrpo on the same four
seeds) whose sweep declares an effect to detect. The primary comparisons come from the
seed-blocked two-way model, recomputed here by hand; the ‡ marks exactly the significant ones
when the seeds can detect the declared effect, and none when they cannot."""

import csv
import functools
import math

import numpy as np
import pytest
from mlflow.entities import Metric, Param
from scipy import stats

from harness.report.board import build_leaderboards as _build
from harness.tracking import open_client
from tests.helpers import md_table

# built from whatever checkout runs the tests; the dirty-tree refusal has its own test
build_leaderboards = functools.partial(_build, allow_dirty=True)
PAIRED = "Paired differences vs baseline (secondary, descriptive)"
PRIMARY_COLUMNS = ("estimate", "se", "t", "low", "high", "p_adjusted", "mde", "significant")

CONFIRM_SEEDS = (0, 1, 2, 3)
CONFIRM_EFFECT = {"grpo": 0.0, "dapo": 0.08, "drgrpo": 0.003}  # dapo: clear; drgrpo: none


@pytest.fixture(scope="module")
def confirm(tmp_path_factory):
    """grpo, dapo and drgrpo on the same four seeds (a seed effect every row shares, small
    noise), launched by sweep ``confirm_test`` from one warm start; built once with a declared
    effect the seeds can detect (confirmatory) and once with one they cannot (descriptive)."""
    root = tmp_path_factory.mktemp("confirm")
    uri = f"sqlite:///{root / 'mlruns.db'}"
    client = open_client(uri)
    exp = client.create_experiment("confirm", artifact_location=(root / "a").as_uri())
    rng = np.random.default_rng(7)
    block = rng.normal(0.0, 0.03, len(CONFIRM_SEEDS))
    values, n = {}, 0
    for alg, effect in CONFIRM_EFFECT.items():
        for seed in CONFIRM_SEEDS:
            v = 0.3 + block[seed] + effect + rng.normal(0.0, 0.01)
            values[alg, seed] = v
            rid = client.create_run(exp, start_time=1000 + n, tags={
                "rlbench.algorithm": alg, "rlbench.task": "countdown",
                "rlbench.task_variant": "tiny", "rlbench.model": "tiny",
                "rlbench.seed": str(seed), "rlbench.temperature": "1.0",
                "rlbench.sweep": "confirm_test"}).info.run_id
            client.log_batch(rid, metrics=[
                Metric("eval/heldout/pass_at_1", 0.1, 0, 0),
                Metric("eval/heldout/pass_at_1", v - 0.05, 0, 10),
                Metric("eval/heldout/pass_at_1", v, 0, 20),
                # the old summary (mean of the last two evaluations): the board reads v
                Metric("final/heldout/pass_at_1", v - 0.025, 0, 20),
                Metric("start/heldout/pass_at_1", 0.1, 0, 0)],
                params=[Param("seed", str(seed)), Param("model.pretrain.seed", "7")])
            client.set_terminated(rid, "FINISHED")
            n += 1

    def build(name, detect):
        cfg = root / f"{name}.yaml"
        cfg.write_text(f"plan:\n  detect:\n    confirm_test: {detect}\n")
        out = root / name
        build_leaderboards(uri, "confirm", out, config=cfg, log_to_mlflow=False, export=False)
        with open(out / "countdown-tiny" / "tiny" / "leaderboard.csv", newline="") as f:
            rows = {r["row"]: r for r in csv.DictReader(f)}
        return {"out": out, "rows": rows, "readme": (out / "README.md").read_text(),
                "md": (out / "countdown-tiny" / "tiny" / "leaderboard.md").read_text()}

    return {"values": values, "powered": build("powered", 0.05),
            "underpowered": build("underpowered", 0.001)}


def _primary_by_hand(values):
    """The seed-blocked two-way model on a complete design, by hand: each estimate is the paired
    mean difference, its SE sigma * sqrt(2 / S) with sigma^2 = SSE / ((R - 1)(S - 1))."""
    algs, seeds = list(CONFIRM_EFFECT), list(CONFIRM_SEEDS)
    y = np.array([[values[a, s] for s in seeds] for a in algs])
    resid = y - y.mean(1, keepdims=True) - y.mean(0, keepdims=True) + y.mean()
    df = (len(algs) - 1) * (len(seeds) - 1)
    se = math.sqrt((resid ** 2).sum() / df) * math.sqrt(2 / len(seeds))
    est = {a: float(np.mean(y[i] - y[0])) for i, a in enumerate(algs) if a != "grpo"}
    return est, se, df


def test_primary_marks_exactly_the_significant_comparisons_of_a_confirmatory_board(confirm):
    """The ‡ sits on a primary comparison exactly when its simultaneous interval excludes 0 and
    the board is confirmatory; the secondary paired table carries no marks at all."""
    board = confirm["powered"]
    md, rows = board["md"], board["rows"]
    est, se, df = _primary_by_hand(confirm["values"])
    primary = md_table(board["out"], "Primary comparisons")
    assert set(primary) == {"dapo", "drgrpo"}
    marked = 0
    for alg in ("dapo", "drgrpo"):
        r = rows[alg]
        low, high, e, s = (float(r[f"primary_{c}"]) for c in ("low", "high", "estimate", "se"))
        assert e == pytest.approx(est[alg], abs=1e-5) and s == pytest.approx(se, rel=1e-4)
        # the simultaneous interval: wider than one t-test's, narrower than Bonferroni's
        crit = (high - e) / s
        assert (e - low) / s == pytest.approx(crit, rel=1e-4)
        # Dunnett's c for two comparisons at 6 df is about 2.87; one t-test's is 2.45,
        # Bonferroni's 3.29
        assert 1.05 * stats.t.ppf(0.975, df) < crit < stats.t.ppf(1 - 0.025 / 2, df)
        excludes = low > 0 or high < 0
        assert primary[alg]["Δ"] == f"{e:+.3f}" + ("‡" if excludes else "")
        assert r["primary_significant"] == str(int(excludes))
        marked += excludes
    assert marked == 1  # the data has both kinds: dapo's +0.08, drgrpo's +0.003
    first_table = md.index("\n## ")
    assert md.index("- **Confirmatory**: the family's minimum detectable effect (") < first_table
    assert "is at or below the 0.05 declared for confirm_test.\n" in md
    assert ("- Held fixed: one warm start for every run (`model.pretrain.seed` = 7): every "
            "interval is conditional on it.\n") in md
    assert "‡: significant for the family at 0.05." in md
    secondary = md.split(f"## {PAIRED}\n", 1)[1].split("\n## ", 1)[0]
    assert "‡" not in secondary and "†" not in secondary
    paired = md_table(board["out"], PAIRED)
    assert paired["dapo"]["Δ heldout pass@1"] == (
        f"{float(rows['dapo']['heldout/pass_at_1/vs_baseline_mean']):+.3f} ± "
        f"{float(rows['dapo']['heldout/pass_at_1/vs_baseline_ci95']):.3f} (4)")
    assert rows["dapo"]["heldout/pass_at_1/vs_baseline_excludes_zero"] == "1"
    mde = max(float(rows[a]["primary_mde"]) for a in ("dapo", "drgrpo"))
    assert mde <= 0.05
    assert (f"; 1 of 2 primary comparisons significant (seed-blocked, Dunnett-adjusted; MDE "
            f"{mde:.3f}); 3 rows, 12 runs") in board["readme"]


def test_no_marks_when_the_seeds_cannot_detect_the_declared_effect(confirm):
    """The same runs, with a declared effect below the MDE: the same intervals, no ‡."""
    board, powered = confirm["underpowered"], confirm["powered"]["rows"]
    md, rows = board["md"], board["rows"]
    assert float(rows["dapo"]["primary_low"]) > 0  # would be marked on a confirmatory board
    for alg in ("dapo", "drgrpo"):
        for c in ("estimate", "low", "high", "p_adjusted", "mde"):
            assert rows[alg][f"primary_{c}"] == powered[alg][f"primary_{c}"]
        assert rows[alg]["primary_significant"] == "0"
    assert "‡" not in md and "No marks: the board is descriptive only." in md
    mde = max(float(rows[a]["primary_mde"]) for a in ("dapo", "drgrpo"))
    assert (f"- **Descriptive only**: its minimum detectable effect, {mde:.3f}, is above the "
            "0.001 its sweep declares it is powered for.\n") in md
    assert "**Confirmatory**" not in md
    assert " (4); descriptive only; 3 rows, 12 runs" in board["readme"]
    assert "primary comparisons significant" not in board["readme"]
