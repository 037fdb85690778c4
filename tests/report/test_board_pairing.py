"""Leaderboard pairings from a config (the LPO paired-temperature protocol), the per-run
``rlbench.baseline`` tag, variants and sampling temperatures as rows, and the Student-t interval
for ten seeds, on a synthetic SQLite MLflow store. Expected values are computed here by hand
(numpy/scipy), not read back from the code under test."""

import csv
import functools
import math
import zlib

import numpy as np
import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
from scipy import stats

from harness.report.board import build_leaderboards as _build
from harness.report.board import load_config
from harness.report.mlflow_log import KIND_TAG, LEADERBOARD
from harness.tracking import open_client

# built from whatever checkout runs the tests; the dirty-tree refusal has its own test
build_leaderboards = functools.partial(_build, allow_dirty=True)

PAIRS_YAML = """\
baseline: grpo
variant: [tags.rlbench.variant]
pairs:
  lpo_fwd@sigma_g: grpo
  lpo_fwd@one: dr_grpo
  lpo_fwd@mu_g: maxrl
"""
TEN = list(range(10))
# (algorithm, variant, temperature, seeds, offset over the per-seed base, extra tags)
CELLS = [
    ("grpo", "", "1.0", TEN, 0.0, {}),
    ("grpo", "", "0.6", [0, 1], -0.05, {}),
    ("lpo_fwd", "sigma_g", "1.0", TEN, 0.05, {}),
    ("dr_grpo", "", "1.0", [0, 1, 2], 0.01, {}),
    ("lpo_fwd", "one", "1.0", [0, 1, 2], 0.01, {}),
    ("maxrl", "", "1.0", [0, 1, 2], 0.02, {}),
    ("lpo_fwd", "mu_g", "1.0", [0, 1, 2], 0.03, {"rlbench.baseline": "grpo"}),  # tag wins
]


def _value(alg, variant, temp, seed):
    """Final pass@1 of a cell's seed: a per-seed level shared by all rows (paired seeds), the
    cell's offset and a small row-specific perturbation."""
    offset = next(c[4] for c in CELLS if c[:3] == (alg, variant, temp))
    rng = np.random.default_rng(zlib.crc32(f"{alg}/{variant}/{temp}/{seed}".encode()))
    wiggle = rng.normal(0, 0.004)
    return 0.3 + 0.02 * seed + offset + wiggle


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairing")
    uri = f"sqlite:///{root / 'mlruns.db'}"
    client = open_client(uri)
    exp = client.create_experiment("lpo", artifact_location=(root / "artifacts").as_uri())
    finals, t = {}, 1_000_000
    for alg, variant, temp, seeds, _, extra in CELLS:
        for seed in seeds:
            t += 1000
            tags = {"rlbench.algorithm": alg, "rlbench.task": "countdown",
                    "rlbench.task_variant": "tiny", "rlbench.model": "tiny",
                    "rlbench.seed": str(seed), "rlbench.temperature": temp,
                    "rlbench.kind": "train", **extra}
            if variant:
                tags["rlbench.variant"] = variant
            rid = client.create_run(exp, start_time=t, tags=tags).info.run_id
            v = _value(alg, variant, temp, seed)
            finals[alg, variant, temp, seed] = v
            client.log_batch(rid, metrics=[
                Metric("final/heldout/pass_at_1", v, 0, 10),
                Metric("start/heldout/pass_at_1", 0.1, 0, 0),
                Metric("eval/heldout/pass_at_1", 0.1, 0, 0),
                Metric("eval/heldout/pass_at_1", v, 0, 10),
                Metric("final/wall_s", 10.0 + seed, 0, 10),
            ], params=[Param("algorithm.advantage.tau", variant or "none")])
            client.set_terminated(rid, "FINISHED", end_time=t + 1)
    # a second (task variant) group: its own leaderboard and leaderboard run
    for seed in (0, 1):
        rid = client.create_run(exp, start_time=t + 5000 + seed, tags={
            "rlbench.algorithm": "grpo", "rlbench.task": "countdown",
            "rlbench.task_variant": "full", "rlbench.model": "tiny",
            "rlbench.seed": str(seed), "rlbench.temperature": "1.0"}).info.run_id
        client.log_batch(rid, metrics=[Metric("final/heldout/pass_at_1", 0.2 + seed, 0, 1)])
        client.set_terminated(rid, "FINISHED")
    cfg = root / "pairs.yaml"
    cfg.write_text(PAIRS_YAML)
    out = root / "leaderboards"
    files = build_leaderboards(uri, "lpo", out, config=cfg)
    return {"uri": uri, "root": root, "out": out, "files": files, "finals": finals, "cfg": cfg}


def _csv(out, sub="countdown-tiny/tiny"):
    with open(out / sub / "leaderboard.csv", newline="") as f:
        return {r["row"]: r for r in csv.DictReader(f)}


def _cells(out, section, key):
    md = (out / "countdown-tiny" / "tiny" / "leaderboard.md").read_text()
    body = md.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    table = body[body.index("\n|"):].split("\n\n", 1)[0]  # the section's first table
    lines = [line for line in table.splitlines() if line.startswith("|")][2:]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return {c[key]: c for c in cells}


def _paired_cells(out):
    """row -> [#, row, baseline, Δ heldout pass@1] of the secondary (descriptive) table."""
    return _cells(out, "Paired differences vs baseline (secondary, descriptive)", 1)


def _primary_cells(out):
    """row -> [row, baseline, seeds, Δ, interval, adjusted p, MDE] of the primary table."""
    return _cells(out, "Primary comparisons", 0)


def _t(values):
    x = np.asarray(values, dtype=float)
    half = stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return x.mean(), half


def test_rows_per_algorithm_variant_and_temperature(board):
    rows = _csv(board["out"])
    assert set(rows) == {"grpo T=1.0", "grpo T=0.6", "lpo_fwd@sigma_g", "lpo_fwd@one",
                         "lpo_fwd@mu_g", "dr_grpo", "maxrl"}
    assert (rows["grpo T=0.6"]["algorithm"], rows["grpo T=0.6"]["temperature"]) == ("grpo", "0.6")
    assert (rows["lpo_fwd@one"]["algorithm"], rows["lpo_fwd@one"]["variant"]) == ("lpo_fwd", "one")
    assert rows["grpo T=0.6"]["n_seeds"] == "2" and rows["lpo_fwd@sigma_g"]["n_seeds"] == "10"


@pytest.mark.parametrize(("row", "baseline", "via"), [
    ("lpo_fwd@sigma_g", "grpo T=1.0", "pairs"),   # pairs map; grpo at the same temperature
    ("lpo_fwd@one", "dr_grpo", "pairs"),
    ("lpo_fwd@mu_g", "grpo T=1.0", "tag"),        # the run's rlbench.baseline tag beats pairs
    ("maxrl", "grpo T=1.0", "default"),
    ("dr_grpo", "grpo T=1.0", "default"),
    ("grpo T=1.0", "", ""),                       # the baseline itself
    ("grpo T=0.6", "", ""),                       # not paired with grpo at another temperature
])
def test_pairing_sources(board, row, baseline, via):
    r = _csv(board["out"])[row]
    assert (r["baseline"], r["baseline_via"]) == (baseline, via)
    assert _paired_cells(board["out"])[row][2] == (baseline or "—")
    # the primary comparison of a row is against the same baseline; a row without one has none
    primary = _primary_cells(board["out"])
    if baseline:
        assert primary[row][1] == baseline
        assert r["primary_estimate"] != ""
    else:
        assert row not in primary and r["primary_estimate"] == ""


def test_paired_difference_t_by_hand(board):
    f = board["finals"]
    diffs = [f["lpo_fwd", "one", "1.0", s] - f["dr_grpo", "", "1.0", s] for s in (0, 1, 2)]
    mean, half = _t(diffs)
    r = _csv(board["out"])["lpo_fwd@one"]
    assert float(r["heldout/pass_at_1/vs_baseline_mean"]) == pytest.approx(mean, abs=1e-6)
    assert float(r["heldout/pass_at_1/vs_baseline_ci95"]) == pytest.approx(half, abs=1e-6)
    assert r["heldout/pass_at_1/vs_baseline_pairs"] == "3"
    # descriptive: the cell is the interval and nothing else, never a mark
    assert _paired_cells(board["out"])["lpo_fwd@one"][3] == f"{mean:+.3f} ± {half:.3f} (3)"
    # lpo_fwd@sigma_g's +0.05 excludes 0 by far, and is still unmarked in this table
    r = _csv(board["out"])["lpo_fwd@sigma_g"]
    assert r["heldout/pass_at_1/vs_baseline_excludes_zero"] == "1"
    assert _paired_cells(board["out"])["lpo_fwd@sigma_g"][3] == (
        f"{float(r['heldout/pass_at_1/vs_baseline_mean']):+.3f} ± "
        f"{float(r['heldout/pass_at_1/vs_baseline_ci95']):.3f} (10)")


def test_ten_seeds_use_the_t_interval(board):
    """With 10 seeds the cell is still the Student-t interval (issue 31: the percentile
    bootstrap the board switched to from 10 seeds on undercovered), printed as mean ± half (n),
    its p-value the t-test's; the paired difference (+0.05 on every seed, up to a small
    perturbation) excludes 0."""
    f, r = board["finals"], _csv(board["out"])["lpo_fwd@sigma_g"]
    vals = [f["lpo_fwd", "sigma_g", "1.0", s] for s in TEN]
    mean, half = _t(vals)
    low, high = float(r["heldout/pass_at_1/final_low"]), float(r["heldout/pass_at_1/final_high"])
    assert float(r["heldout/pass_at_1/final_mean"]) == pytest.approx(mean, abs=1e-6)
    assert (low, high) == pytest.approx((mean - half, mean + half), abs=1e-6)
    md = (board["out"] / "countdown-tiny" / "tiny" / "leaderboard.md").read_text()
    assert f"{mean:.3f} ± {half:.3f} (10)" in md
    diffs = [v - f["grpo", "", "1.0", s] for s, v in zip(TEN, vals)]
    d_mean, d_half = _t(diffs)
    assert float(r["heldout/pass_at_1/vs_baseline_mean"]) == pytest.approx(d_mean, abs=1e-6)
    assert float(r["heldout/pass_at_1/vs_baseline_low"]) == pytest.approx(d_mean - d_half,
                                                                          abs=1e-6)
    assert float(r["heldout/pass_at_1/vs_baseline_p"]) == pytest.approx(  # CSV: 6 decimals
        stats.ttest_1samp(diffs, 0.0).pvalue, abs=1e-6)
    assert r["heldout/pass_at_1/vs_baseline_excludes_zero"] == "1"
    assert f"{d_mean:+.3f} ± {d_half:.3f} (10)" in md
    # deterministic: the same numbers on a rebuild
    again = build_leaderboards(board["uri"], "lpo", board["root"] / "again", config=board["cfg"],
                               log_to_mlflow=False)
    assert (board["root"] / "again" / "countdown-tiny" / "tiny" / "leaderboard.csv").read_text() \
        == (board["out"] / "countdown-tiny" / "tiny" / "leaderboard.csv").read_text()
    assert len(again) == len(board["files"])


@pytest.mark.slow
def test_baseline_argument_replaces_the_default_only(board):
    out = board["root"] / "vs_maxrl"
    build_leaderboards(board["uri"], "lpo", out, baseline="maxrl", config=board["cfg"],
                       log_to_mlflow=False)
    rows = _csv(out)
    assert rows["dr_grpo"]["baseline"] == "maxrl" and rows["maxrl"]["baseline"] == ""
    assert rows["lpo_fwd@one"]["baseline"] == "dr_grpo"  # pairs still apply
    md = (out / "countdown-tiny" / "tiny" / "leaderboard.md").read_text()
    assert "--baseline maxrl --config pairs.yaml --no-mlflow" in md
    out = board["root"] / "vs_none"
    build_leaderboards(board["uri"], "lpo", out, baseline="ppo", config=board["cfg"],
                       log_to_mlflow=False)
    assert _csv(out)["maxrl"]["baseline"] == ""
    assert _paired_cells(out)["maxrl"][2] == "— (no ppo runs)"


def test_variant_from_a_param(board, tmp_path):
    cfg = tmp_path / "params.yaml"
    cfg.write_text("variant: [params.algorithm.advantage.tau]\npairs: {lpo_fwd@one: dr_grpo}\n")
    out = tmp_path / "lb"
    build_leaderboards(board["uri"], "lpo", out, config=cfg, log_to_mlflow=False)
    rows = _csv(out)
    assert {"grpo@none T=1.0", "lpo_fwd@sigma_g", "dr_grpo@none"} <= set(rows)
    # the pairs entry names "dr_grpo", no row is labelled so: it falls back to the algorithm
    assert rows["lpo_fwd@one"]["baseline"] == "dr_grpo@none"


def test_every_group_indexed_and_logged(board):
    readme = (board["out"] / "README.md").read_text()
    assert "(countdown-full/tiny/leaderboard.md)" in readme
    assert "(countdown-tiny/tiny/leaderboard.md)" in readme
    assert readme.count("  - made by `rlbench board ") == 2
    client = MlflowClient(board["uri"])
    exp_id = client.get_experiment_by_name("lpo").experiment_id
    runs = client.search_runs([exp_id], f"tags.`{KIND_TAG}` = '{LEADERBOARD}'")
    assert sorted(r.data.tags["rlbench.task_variant"] for r in runs) == ["full", "tiny"]
    tiny = next(r for r in runs if r.data.tags["rlbench.task_variant"] == "tiny")
    ids = tiny.data.tags["rlbench.leaderboard.runs.grpo T_1.0"].split(",")
    assert [i.split(":")[0] for i in ids] == [str(s) for s in TEN]
    assert tiny.data.tags["rlbench.leaderboard.runs.lpo_fwd_sigma_g"].count(":") == 10


def test_config_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("baseline: grpo\npair: {}\n")
    with pytest.raises(ValueError, match=r"unknown key.*pair"):
        load_config(bad)
    bad.write_text("variant: [rlbench.variant]\n")
    with pytest.raises(ValueError, match=r"tags\."):
        load_config(bad)
    bad.write_text("final_window: 0\n")
    with pytest.raises(ValueError, match="final_window"):
        load_config(bad)
    with pytest.raises(ValueError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    default = load_config()
    assert default.baseline == "grpo" and default.pairs["lpo_fwd@one"] == "dr_grpo"
    assert default.source == "conf/board/default.yaml" and default.final_window == 10
