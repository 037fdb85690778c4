"""Fair comparisons on a board (issue 20), from synthetic SQLite MLflow stores whose expected
numbers are computed here by hand: the learning-rate selection on a validation split, matched
step size (pre-clip gradient norm, clipped share), matched compute (the equal token budget, read
from measured evaluations only), the primary comparisons' family (the primary metric alone) beside
the uncorrected secondary intervals, no "best" with one seed, and plot styles."""

from __future__ import annotations

import csv
import functools
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
from scipy import stats

from harness.report.analysis import analyse
from harness.report.board import build_leaderboards as _build
from harness.report.mlflow_log import KIND_TAG, LEADERBOARD
from harness.report.plots import ALGORITHM_ORDER, Curve, plot_curves, style
from harness.report.stats import interval
from harness.tracking import open_client

ROOT = Path(__file__).resolve().parents[2]

build_leaderboards = functools.partial(_build, allow_dirty=True)
TUNED = "conf/board/lpo_lr_tuned.yaml"
SEEDS = (0, 1, 2)
LRS = ("0.0001", "0.0003", "0.001")
# validation and heldout pass@1 by (algorithm, lr): the validation-best rate is never the
# heldout-best one, so a board that selected on heldout would pick other rows
VALID = {"grpo": (0.20, 0.25, 0.22), "lpo_fwd": (0.30, 0.10, 0.12)}
HELD = {"grpo": (0.30, 0.21, 0.40), "lpo_fwd": (0.26, 0.50, 0.45)}


def _run(client, exp, *, alg, seed, params, metrics, tags=None, start=0):
    rid = client.create_run(exp, start_time=1000 + start, tags={
        "rlbench.algorithm": alg, "rlbench.task": "countdown", "rlbench.task_variant": "tiny",
        "rlbench.model": "tiny", "rlbench.seed": str(seed), "rlbench.temperature": "1.0",
        "rlbench.sweep": "lpo_lr_tuning", **(tags or {})}).info.run_id
    client.log_batch(rid, metrics=[Metric(k, v, 0, s) for k, s, v in metrics],
                     params=[Param(k, str(v)) for k, v in {"seed": seed, **params}.items()])
    client.set_terminated(rid, "FINISHED")
    return rid


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    root = tmp_path_factory.mktemp("tuned")
    uri = f"sqlite:///{root / 'mlruns.db'}"
    client = open_client(uri)
    exp = client.create_experiment("lpo_lr_tuning", artifact_location=(root / "a").as_uri())
    n = 0
    for alg, tau in (("grpo", None), ("lpo_fwd", "sigma_g")):
        for i, lr in enumerate(LRS):
            for seed in SEEDS:
                params = {"algorithm.name": alg, "trainer.optim.lr": lr,
                          **({"algorithm.advantage.tau": tau} if tau else {})}
                held = HELD[alg][i] + 0.002 * seed
                _run(client, exp, alg=alg, seed=seed, params=params, start=n, metrics=[
                    ("final/validation/pass_at_1", 20, VALID[alg][i] + 0.001 * seed),
                    ("final/heldout/pass_at_1", 20, held), ("eval/heldout/pass_at_1", 0, 0.1),
                    ("eval/heldout/pass_at_1", 20, held)])
                n += 1
    out = root / "board"
    build_leaderboards(uri, "lpo_lr_tuning", out, config=TUNED)
    with open(out / "countdown-tiny" / "tiny" / "leaderboard.csv", newline="") as f:
        rows = {r["row"]: r for r in csv.DictReader(f)}
    return {"uri": uri, "out": out, "rows": rows,
            "md": (out / "countdown-tiny" / "tiny" / "leaderboard.md").read_text()}


def test_learning_rate_is_selected_on_validation_and_heldout_reported(tuned):
    rows = tuned["rows"]
    assert set(rows) == {"grpo", "lpo_fwd@sigma_g"}
    assert rows["grpo"]["selected"] == "0.0003" and rows["lpo_fwd@sigma_g"]["selected"] == "0.0001"
    assert float(rows["grpo"]["heldout/pass_at_1/final_mean"]) == pytest.approx(0.21 + 0.002)
    assert float(rows["lpo_fwd@sigma_g"]["heldout/pass_at_1/final_mean"]) == \
        pytest.approx(0.26 + 0.002)
    assert not any(k.startswith("validation/") for k in rows["grpo"])  # the tuning split
    # paired at the selected rates (pairs of conf/board/lpo_lr_tuned.yaml)
    assert rows["lpo_fwd@sigma_g"]["baseline"] == "grpo"
    assert float(rows["lpo_fwd@sigma_g"]["heldout/pass_at_1/vs_baseline_mean"]) == \
        pytest.approx(0.26 - 0.21)


def test_selection_grid_and_choice_on_the_page_and_in_mlflow(tuned):
    sel = tuned["md"].split("## Selection\n", 1)[1].split("\n## ", 1)[0]
    assert "| row | lr=0.0001 | lr=0.0003 | lr=0.001 |" in sel
    assert "| grpo | 0.201 ± " in sel and "| **0.251 ± 0.002 (3)** ✓ |" in sel
    # the header counts the runs shown and the grid the choice was read from
    assert ("- Generated from 6 finished runs at the selected values; the selection read all 18 "
            "runs of the grid (Selection).") in tuned["md"]
    client = MlflowClient(tuned["uri"])
    exp = client.get_experiment_by_name("lpo_lr_tuning").experiment_id
    (run,) = client.search_runs([exp], f"tags.`{KIND_TAG}` = '{LEADERBOARD}'")
    assert run.data.tags["rlbench.leaderboard.selection.grpo"] == \
        "0.0001:0.201,0.0003:0.251,0.001:0.221|0.0003"
    assert run.data.params["select.key"] == "params.trainer.optim.lr"
    assert run.data.params["select.metric"] == "validation/pass_at_1"


def test_step_size_table_shows_each_rows_selected_learning_rate(tuned):
    step = tuned["md"].split("## Step size\n", 1)[1].split("\n## ", 1)[0]
    assert "| grpo | 0.0003 |" in step and "| lpo_fwd@sigma_g | 0.0001 |" in step


# -- step size, compute budget, primary family, bolding -----------------------------------------
# evaluations at steps 0, 10, 20; grpo and dapo generate 100 tokens a step, so their last
# evaluation is at 2,000 tokens (the budget); lope about twice as many: seeds 0 and 1 205 a step
# (step 10 at 2,050 tokens, 2.5% past the budget), seed 2 212 (step 10 at 2,120: 6%, too far)
EVAL = {"grpo": (0.10, 0.20, 0.30), "lope": (0.10, 0.25, 0.50), "dapo": (0.1, 0.5, 0.9)}
PER_STEP = {"grpo": 100, "lope": 205, "dapo": 100}
PER_STEP_SEED = {("lope", 2): 212}
GRAD = {"grpo": (0.5, 0.0), "lope": (5.0, 1.0), "dapo": (0.6, 0.0)}  # norm, clipped share


@pytest.fixture(scope="module")
def fair(tmp_path_factory):
    root = tmp_path_factory.mktemp("fair")
    uri = f"sqlite:///{root / 'mlruns.db'}"
    client = open_client(uri)
    exp = client.create_experiment("fair", artifact_location=(root / "a").as_uri())
    values, n = {}, 0
    for alg, seeds in (("grpo", SEEDS), ("lope", SEEDS), ("dapo", (0,))):
        for seed in seeds:
            rng = np.random.default_rng(10 * seed + {"grpo": 1, "lope": 2, "dapo": 3}[alg])
            ev = [v + rng.normal(0, 0.01) for v in EVAL[alg]]
            # pass@8 barely differs between rows: a secondary metric, outside the family
            ev8 = [0.5 + rng.normal(0, 0.02) for _ in EVAL[alg]]
            values[alg, seed] = ev, ev8
            metrics = [(f"eval/heldout/pass_at_{k}", s, v) for k, curve in ((1, ev), (8, ev8))
                       for s, v in zip((0, 10, 20), curve)]
            # logged as before issue 31 (mean of the last two); the board reads the last one
            metrics += [("final/heldout/pass_at_1", 20, (ev[1] + ev[2]) / 2),
                        ("final/heldout/pass_at_8", 20, (ev8[1] + ev8[2]) / 2)]
            per_step = PER_STEP_SEED.get((alg, seed), PER_STEP[alg])
            metrics += [(m, s, v) for s in range(1, 21) for m, v in (
                ("rollout/tokens_total", per_step * s), ("actor/grad_norm", GRAD[alg][0]),
                ("actor/grad_clipped_frac", GRAD[alg][1]))]
            _run(client, exp, alg=alg, seed=seed, start=n, metrics=metrics,
                 params={"algorithm.name": alg, "trainer.optim.lr": "0.0001",
                         "trainer.optim.grad_clip": "1.0"}, tags={"rlbench.sweep": ""})
            n += 1
    out = root / "board"
    build_leaderboards(uri, "fair", out)
    with open(out / "countdown-tiny" / "tiny" / "leaderboard.csv", newline="") as f:
        rows = {r["row"]: r for r in csv.DictReader(f)}
    return {"rows": rows, "values": values, "uri": uri, "root": root,
            "md": (out / "countdown-tiny" / "tiny" / "leaderboard.md").read_text()}


def _section(md, title):
    body = md.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    table = body[body.index("\n|"):].split("\n\n", 1)[0]
    lines = [line for line in table.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return {r["row"]: r for r in (dict(zip(header, (c.strip() for c in line.strip("|").split("|"))))
                                  for line in lines[2:])}


def test_step_size_table_reports_grad_norm_and_clipped_share(fair):
    table = _section(fair["md"], "Step size")
    assert table["lope"]["pre-clip grad norm"] == "5.000 ± 0.000 (3)"
    assert table["lope"]["clipped steps"] == "1.000 ± 0.000 (3)"
    assert table["grpo"]["clipped steps"] == "0.000 ± 0.000 (3)"
    assert table["grpo"]["lr"] == "0.0001" and table["grpo"]["grad clip"] == "1.0"
    assert float(fair["rows"]["lope"]["grad_norm/final_mean"]) == pytest.approx(5.0)


def _interpolated(curve, tokens, at):
    """The value a straight line between the two evaluations around ``at`` tokens would give."""
    return float(np.interp(at, tokens, curve))


def test_equal_budget_reads_measured_evaluations_within_five_percent(fair):
    """Budget = 2,000 tokens (no declared marks: the smallest token count of any run's last
    evaluation, grpo's and dapo's at step 20). lope seeds 0 and 1 are read at their step-10
    evaluation (2,050 tokens, 2.5% away) at exactly its value, not a value interpolated to 2,000
    tokens; lope seed 2's nearest evaluation (2,120 tokens, 6%) is too far: it is left out."""
    rows, values, md = fair["rows"], fair["values"], fair["md"]
    assert ("Budget: 2,000 tokens generated (no declared mark: the smallest final evaluation's "
            "tokens); 6 runs read within 2.5% of it; 1 run had no evaluation within 5% and is "
            "left out of their rows (`n` counts the runs read).") in md
    lope = rows["lope"]
    measured = [values["lope", s][0][1] for s in (0, 1)]
    assert lope["heldout/pass_at_1/at_budget_n"] == "2"
    assert float(lope["heldout/pass_at_1/at_budget_mean"]) == pytest.approx(np.mean(measured),
                                                                            abs=1e-6)
    interpolated = [_interpolated(values["lope", s][0], [0, 10 * 205, 20 * 205], 2000)
                    for s in (0, 1)]
    assert abs(np.mean(interpolated) - np.mean(measured)) > 1e-3  # the rules differ here
    assert float(lope["budget_step_mean"]) == pytest.approx(10.0)
    assert float(lope["budget_tokens_mean"]) == pytest.approx(2050.0)
    assert lope["budget_tokens_n"] == "2"
    # pass@8 is read from the same evaluations, the same runs left out
    assert lope["heldout/pass_at_8/at_budget_n"] == "2"
    assert float(lope["heldout/pass_at_8/at_budget_mean"]) == pytest.approx(
        np.mean([values["lope", s][1][1] for s in (0, 1)]), abs=1e-6)
    grpo = [values["grpo", s][0][2] for s in SEEDS]
    assert float(rows["grpo"]["heldout/pass_at_1/at_budget_mean"]) == \
        pytest.approx(np.mean(grpo), abs=1e-6)
    assert float(rows["grpo"]["budget_tokens_mean"]) == pytest.approx(2000.0)
    assert float(rows["grpo"]["budget_step_mean"]) == pytest.approx(20.0)
    budget = _section(md, "Equal compute budget")
    assert budget["lope"]["step"] == "10.0 ± 0.0 (2)"
    assert budget["lope"]["tokens"] == "2,050 ± 0 (2)"
    assert budget["lope"]["heldout pass@1"].strip("*").endswith(" (2)")
    assert budget["dapo"]["tokens"] == "2,000 ± n/a (1)"
    assert "heldout-pass_at_1-tokens.png" in md


def test_primary_family_is_the_primary_metrics_comparisons_alone(fair):
    """The primary comparisons (one per row with a baseline, on heldout pass@1 of the last
    evaluation) are adjusted together exactly as the seed-blocked analysis of those per-seed
    values adjusts them; pass@8 and the other secondary metrics keep their uncorrected paired
    p-values and are in no family."""
    rows, values, md = fair["rows"], fair["values"], fair["md"]
    last = {alg: {str(s): values[alg, s][0][2] for s in seeds}
            for alg, seeds in (("grpo", SEEDS), ("lope", SEEDS), ("dapo", (0,)))}
    # dapo shares one seed with grpo: nothing to test on, so the family is lope's comparison
    expected = analyse(last, [("lope", "grpo")])
    assert len(expected.comparisons) == 1
    for comp in expected.comparisons:
        row = rows[comp.row]
        assert row["baseline"] == "grpo"
        for c in ("estimate", "se", "t", "low", "high", "p_adjusted", "mde"):
            assert float(row[f"primary_{c}"]) == pytest.approx(getattr(comp, c), rel=1e-5,
                                                               abs=1e-9)
    # the family is the primary comparisons alone: a larger one (here with dapo's one-seed
    # comparison) has a larger critical value, hence a larger MDE
    with_dapo = analyse(last, [("dapo", "grpo"), ("lope", "grpo")])
    lope = next(c for c in with_dapo.comparisons if c.row == "lope")
    assert float(rows["lope"]["primary_mde"]) < lope.mde / 1.05
    assert rows["dapo"]["primary_estimate"] == ""
    assert rows["grpo"]["primary_p_adjusted"] == ""
    primary = _section(md, "Primary comparisons")
    assert set(primary) == {"lope"}
    # secondary: the uncorrected paired t-test, per metric, with no adjusted column
    for k, idx in ((1, 0), (8, 1)):
        diffs = [values["lope", s][idx][2] - values["grpo", s][idx][2] for s in SEEDS]
        assert float(rows["lope"][f"heldout/pass_at_{k}/vs_baseline_p"]) == \
            pytest.approx(stats.ttest_1samp(diffs, 0.0).pvalue, abs=1e-6)
    assert not any("holm" in key or ("pass_at_8" in key and "adjusted" in key)
                   for key in rows["lope"])
    # dapo has one seed: no paired interval, no p
    assert rows["dapo"]["heldout/pass_at_1/vs_baseline_p"] == "nan"
    assert "secondary metrics descriptive (no marks)" in md
    secondary = md.split("## Paired differences vs baseline (secondary, descriptive)\n", 1)[1]
    assert "†" not in secondary.split("\n## ", 1)[0] and "Holm" not in md


def test_one_seed_is_never_bold(fair):
    quality = _section(fair["md"], "Quality (final)")
    assert float(fair["rows"]["dapo"]["heldout/pass_at_1/final_mean"]) > \
        float(fair["rows"]["lope"]["heldout/pass_at_1/final_mean"])
    assert "**" not in quality["dapo"]["heldout pass@1"]  # the top mean, but one seed
    assert quality["lope"]["heldout pass@1"].startswith("**")


@pytest.mark.slow
def test_one_colour_per_algorithm_on_every_board_and_16_rows_distinguishable():
    colours = [style(a).color for a in ALGORITHM_ORDER]
    assert len(set(colours)) == len(ALGORITHM_ORDER) >= 16
    assert style("lpo_fwd", 0).color == style("lpo_fwd", 3).color  # a variant keeps the colour
    looks = {(style("lpo_fwd", i).linestyle, style("lpo_fwd", i).marker) for i in range(16)}
    assert len(looks) == 16
    # a plugin's colour is the same in every process: two interpreters with different string
    # hash seeds (a colour from hash() would differ between them)
    probe = "from harness.report.plots import style; print(style('my_plugin_alg').color)"
    seen = {subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           check=True, cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": seed}
                           ).stdout for seed in ("1", "2")}
    assert len(seen) == 1 and "(" in seen.pop()


def test_plot_marks_evaluations_and_bands_are_the_tables_interval(tmp_path):
    values = np.array([[0.1, 0.2, 0.4], [0.2, 0.25, 0.3], [0.15, 0.3, 0.35]])
    curve = Curve("grpo", np.array([0, 10, 20]), values, style("grpo"))
    fig = plot_curves(tmp_path / "p.png", [curve], "t", "y", markers=True)
    (ax,) = fig.axes
    assert ax.lines[0].get_marker() == "o"
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    for j in range(3):
        iv = interval(values[:, j])
        assert np.isclose(band, iv.low).any() and np.isclose(band, iv.high).any()
    assert not math.isnan(iv.low)


def test_a_plan_that_reads_at_the_budget_tests_each_runs_evaluation_there(fair):
    """``plan.read: budget`` (LOPE against GRPO at equal generated tokens): the primary
    comparison is the seed-blocked test of each run's evaluation at the common budget, the runs
    with none within 5% left out, not of its last evaluation; the page says where it read."""
    values, root = fair["values"], fair["root"]
    cfg = root / "budget.yaml"
    cfg.write_text("baseline: grpo\nplan: {read: budget}\n")
    out = root / "board_budget"
    build_leaderboards(fair["uri"], "fair", out, config=cfg)
    page = out / "countdown-tiny" / "tiny"
    with open(page / "leaderboard.csv", newline="") as f:
        rows = {r["row"]: r for r in csv.DictReader(f)}
    md = (page / "leaderboard.md").read_text()
    at = {"grpo": {str(s): values["grpo", s][0][2] for s in SEEDS},
          "lope": {str(s): values["lope", s][0][1] for s in (0, 1)}}  # seed 2: none near
    (comp,) = analyse(at, [("lope", "grpo")]).comparisons
    assert comp.n == 2
    for c in ("estimate", "low", "high", "p_adjusted", "mde"):
        assert float(rows["lope"][f"primary_{c}"]) == pytest.approx(getattr(comp, c), rel=1e-5,
                                                                    abs=1e-9)
    last = analyse({a: {str(s): values[a, s][0][2] for s in SEEDS} for a in ("grpo", "lope")},
                   [("lope", "grpo")]).comparisons[0]
    assert abs(last.estimate - comp.estimate) > 0.05  # the two reads differ on this store
    assert "- Primary metric: heldout pass@1 (evaluation at the common budget of 2,000 tokens " \
        "generated (within 5%))." in md
    assert "primary metric heldout pass@1 of each run's evaluation at the common budget" in md
    # rows ranked, and the index line read, at the budget: here GRPO's mean there is above
    # LOPE's, the reverse of their last evaluations (about 0.30 against 0.50)
    mean = {a: float(np.mean(list(v.values()))) for a, v in at.items()}
    assert mean["grpo"] > mean["lope"]
    assert [r for r in rows if r != "dapo"] == ["grpo", "lope"]
    index = (out / "README.md").read_text()
    assert "highest mean heldout pass@1 at the token budget: **dapo** 0.9" in index


def test_plan_read_takes_final_or_budget_only(tmp_path):
    from harness.report.config import BoardError, load_config

    cfg = tmp_path / "bad.yaml"
    cfg.write_text("plan: {read: last}\n")
    with pytest.raises(BoardError, match=r"plan\.read must be final .* or budget .*got 'last'"):
        load_config(cfg)


@pytest.mark.slow
def test_at_the_budget_controls_are_read_there_and_do_not_move_it(tmp_path):
    """``plan.read: budget`` with declared controls: the positive control (a tenth of the rate,
    trained 30 steps) is tested at the budget, where it is below GRPO, not at its last
    evaluation, where it is above; an A/A run that stopped short (1,400 tokens) is left out of
    its row instead of pulling the method rows' budget (2,000 tokens) down to it."""
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    client = open_client(uri)
    exp = client.create_experiment("bed", artifact_location=(tmp_path / "a").as_uri())
    curves = {"grpo": (0.10, 0.20, 0.30), "lope": (0.10, 0.22, 0.28),
              "grpo@lr_div10": (0.10, 0.05, 0.08, 0.60), "grpo@aa": (0.10, 0.20, 0.30)}
    n = 0
    for label, ev in curves.items():
        alg, _, variant = label.partition("@")
        for seed in SEEDS:
            train_seed = 200 + seed if variant == "aa" else seed
            rng = np.random.default_rng(train_seed + 7 * n)
            vals = [v + rng.normal(0, 0.004) for v in ev]
            per_step = {"lope": 205, "grpo@aa": 70 if seed == 2 else 100}.get(label, 100)
            steps = [10 * i for i in range(len(vals))]
            metrics = [("eval/heldout/pass_at_1", s, v) for s, v in zip(steps, vals)]
            metrics += [("final/heldout/pass_at_1", steps[-1], vals[-1])]
            metrics += [("rollout/tokens_total", s, per_step * s) for s in range(1, steps[-1] + 1)]
            tags = {"rlbench.sweep": "bed", "rlbench.seed": str(seed),
                    "rlbench.train_seed": str(train_seed),
                    **({"rlbench.variant": variant} if variant else {})}
            _run(client, exp, alg=alg, seed=seed, start=n, metrics=metrics, tags=tags,
                 params={"algorithm.name": alg, "seed": train_seed, "trainer.optim.lr":
                         "1e-05" if variant == "lr_div10" else "0.0001",
                         **({"block_seed": seed} if variant == "aa" else {})})
            n += 1
    cfg = tmp_path / "bed.yaml"
    cfg.write_text("baseline: grpo\nvariant: [tags.rlbench.variant]\nplan: {read: budget, "
                   "controls: {bed: {positive: grpo@lr_div10, aa: grpo@aa}}}\n")
    build_leaderboards(uri, "bed", tmp_path / "board", config=cfg)
    page = tmp_path / "board" / "countdown-tiny" / "tiny"
    with open(page / "leaderboard.csv", newline="") as f:
        rows = {r["row"]: r for r in csv.DictReader(f)}
    md = (page / "leaderboard.md").read_text()
    assert "common budget of 2,000 tokens generated" in md
    assert rows["grpo@lr_div10"]["control_result"] == "detected"
    assert float(rows["grpo@lr_div10"]["primary_estimate"]) == pytest.approx(0.08 - 0.30,
                                                                            abs=0.02)
    assert rows["grpo@aa"]["control_result"] == "not detected"
    assert rows["grpo@aa"]["heldout/pass_at_1/at_budget_n"] == "2"  # seed 2 stopped short
    # rlbench power plans from the same read: the method rows at the budget, as the board
    from harness.cli.power import plan_lines

    lines = plan_lines(uri, "bed", str(cfg), [0.05])
    assert any("(at the budget of 2,000 tokens); 1 comparisons" in ln for ln in lines), lines
