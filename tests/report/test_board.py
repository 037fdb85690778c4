"""End-to-end leaderboard generation from a synthetic SQLite MLflow store. Three algorithms x three
seeds of FINISHED runs (drgrpo on seeds 1-3, tagged as a paired variant of dapo, so its paired
difference covers only seeds 1 and 2), plus a KILLED run and an older duplicate of one cell that
must be reported, not counted. The runs log their ``final/*`` quality summary as runs before
issue 31 did (the mean of the last two evaluations); the board reports the last evaluation.
Expected numbers are recomputed here with numpy/scipy. A second, complete store whose sweep
declares an effect to detect makes a confirmatory board (test_board_confirmatory.py).
Pairing configs, variants and temperatures are in test_board_pairing.py; the leaderboard run read
back through a real MLflow server in test_board_mlflow.py.
"""

import csv
import functools
import json
import math
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from scipy import stats

from harness.report.board import build_leaderboards as _build
from harness.report.board import display_tracking_uri
from harness.report.mlflow_log import KIND_TAG, LEADERBOARD
from harness.report.plots import align as _align
from harness.tracking import open_client
from tests.helpers import md_table

# built from whatever checkout runs the tests; the dirty-tree refusal has its own test
build_leaderboards = functools.partial(_build, allow_dirty=True)

EVAL_STEPS = [0, 10, 20, 30]
SEEDS = {"grpo": [0, 1, 2], "dapo": [0, 1, 2], "drgrpo": [1, 2, 3]}
LEVEL = {"grpo": 0.30, "dapo": 0.40, "drgrpo": 0.50}  # final pass@1 ordering: drgrpo > dapo > grpo
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PAIRED = "Paired differences vs baseline (secondary, descriptive)"
PRIMARY_COLUMNS = ("estimate", "se", "t", "low", "high", "p_adjusted", "mde", "significant")


def _log_run(client, exp_id, alg, seed, *, level, start_time, status="FINISHED", extra_step=False):
    tags = {"rlbench.algorithm": alg, "rlbench.task": "countdown", "rlbench.task_variant": "tiny",
            "rlbench.model": "tiny", "rlbench.seed": str(seed), "rlbench.backend": "hf",
            "rlbench.temperature": "1.0"}
    if alg == "drgrpo":
        tags["rlbench.baseline"] = "dapo"
    run_id = client.create_run(exp_id, start_time=start_time, tags=tags).info.run_id
    rng = np.random.default_rng(1000 * seed + int(level * 100))
    steps = sorted([*EVAL_STEPS, 25] if extra_step else EVAL_STEPS)
    # summary: what the board must report; logged: the pre-issue-31 summaries it must not
    metrics, summary, logged = [], {}, {}
    for name, k, offset in (("heldout", 1, 0.0), ("heldout", 8, 0.3), ("train", 1, 0.1)):
        curve = {s: 0.1 + offset + (level - 0.1) * s / 30 + rng.normal(0, 0.03) for s in steps}
        metrics += [Metric(f"eval/{name}/pass_at_{k}", v, 0, s) for s, v in curve.items()]
        logged[f"final/{name}/pass_at_{k}"] = (curve[steps[-2]] + curve[steps[-1]]) / 2
        summary[f"final/{name}/pass_at_{k}"] = curve[steps[-1]]  # the last evaluation
        summary[f"start/{name}/pass_at_{k}"] = curve[0]
    # no eval/heldout/mean_at_8 is logged: the summary itself is all there is, and is reported
    summary["final/heldout/mean_at_8"] = logged["final/heldout/pass_at_1"] + 0.01
    tools = {name: {st: base + st / 10 + rng.normal(0, 0.1) for st in steps}
             for name, base in (("heldout", 2.0), ("train", 3.0))}
    metrics += [Metric(f"eval/{name}/tool_calls_per_traj", v, 0, st)
                for name, curve in tools.items() for st, v in curve.items()]
    entropy = {s: 1.5 - s / 40 + rng.normal(0, 0.05) + (0.2 if alg == "dapo" else 0.0)
               for s in range(31)}
    for s in range(31):
        metrics += [Metric("rollout/entropy", entropy[s], 0, s),
                    Metric("rollout/reward_mean", level * s / 30 + rng.normal(0, 0.05), 0, s),
                    Metric("rollout/response_len_mean", 20 + s / 3 + rng.normal(0, 1), 0, s),
                    Metric("rollout/tokens_total", 1000.0 * (s + 1), 0, s)]
    summary.update({"final/steps": 30.0, "final/tokens_total": 31000.0 + seed,
                    "final/wall_s": 60.0 + 5 * seed, "final/peak_mem_mb": 900.0 + 10 * seed})
    if alg == "dapo":  # tokens_trained logged by some runs only: the column appears
        summary["final/tokens_trained"] = 20000.0 + 100 * seed
    metrics += [Metric(k, v, 0, 30) for k, v in {**summary, **logged}.items()]
    client.log_batch(run_id, metrics=metrics)
    client.set_terminated(run_id, status, end_time=start_time + 1)
    summary["entropy_last10"] = float(np.mean([entropy[s] for s in range(21, 31)]))
    # the last evaluation of each eval set, averaged over the sets
    summary["tools_last"] = float(np.mean([c[steps[-1]] for c in tools.values()]))
    summary["tools_last2"] = float(np.mean([(c[steps[-2]] + c[steps[-1]]) / 2
                                            for c in tools.values()]))
    summary["logged"] = logged
    return run_id, summary


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("board")
    uri = f"sqlite:///{root / 'mlruns.db'}"
    client = open_client(uri)
    exp = client.create_experiment("rlbench", artifact_location=(root / "artifacts").as_uri())
    runs, t = {}, 1_000_000
    # Older duplicate of grpo/seed 1: superseded by the later run of the same seed.
    stale_id, _ = _log_run(client, exp, "grpo", 1, level=0.9, start_time=t)
    for alg, seeds in sorted(SEEDS.items()):
        for seed in seeds:
            t += 1000
            runs[alg, seed] = _log_run(client, exp, alg, seed, level=LEVEL[alg], start_time=t,
                                       extra_step=(alg, seed) == ("dapo", 0))
    killed_id, _ = _log_run(client, exp, "grpo", 7, level=1.0, start_time=t + 1000,
                            status="KILLED")
    other = client.create_experiment("only-killed", artifact_location=(root / "a2").as_uri())
    _log_run(client, other, "grpo", 0, level=0.3, start_time=t, status="KILLED")
    out = root / "leaderboards"
    files = build_leaderboards(uri, "rlbench", out, baseline="grpo")
    return {"uri": uri, "root": root, "out": out, "files": files, "runs": runs,
            "killed": killed_id, "stale": stale_id}


def _ci(values):
    x = np.asarray(values, dtype=float)
    return x.mean(), stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)


def _rows(store):
    with open(store["out"] / "countdown-tiny" / "tiny" / "leaderboard.csv", newline="") as f:
        return {r["algorithm"]: r for r in csv.DictReader(f)}


def _md_table(store, section, sub="countdown-tiny/tiny"):
    """The markdown table under ``## <section>`` as {row: {column: cell}}."""
    return md_table(store["out"], section, sub)


def test_written_files(store):
    """Per pass@k spec the overview and, since rows have baselines, the small multiple of each
    row against its baseline, both against step and against tokens generated."""
    d = store["out"] / "countdown-tiny" / "tiny"
    pngs = ["entropy.png", "response_len.png", "reward.png"]
    pngs += [f"{stem}{x}{vs}.png" for stem in ("heldout-pass_at_1", "heldout-pass_at_8",
                                               "train-pass_at_1")
             for x in ("", "-tokens") for vs in ("", "-vs-baseline")]
    names = ["leaderboard.csv", "leaderboard.md", *pngs, "runs.jsonl.gz"]
    assert store["files"] == sorted([store["out"] / "README.md", *(d / n for n in names)])
    md = (d / "leaderboard.md").read_text()
    for png in pngs:
        data = (d / png).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 1000
        assert f"]({png})" in md  # every curve is shown on the page


def test_csv_means_cis_and_order(store):
    """Final quality is each run's last evaluation (not its logged mean of the last two), then
    mean and Student-t interval over seeds."""
    rows = _rows(store)
    assert list(rows) == ["drgrpo", "dapo", "grpo"]  # sorted by heldout pass@1, descending
    # the fixture tells the two rules apart: the logged summary is not the last evaluation
    gaps = [abs(summ["final/heldout/pass_at_1"] - summ["logged"]["final/heldout/pass_at_1"])
            for _, summ in store["runs"].values()]
    assert min(gaps) > 1e-6 and max(gaps) > 0.01
    for alg, seeds in SEEDS.items():
        row, summ = rows[alg], [store["runs"][alg, s][1] for s in seeds]
        assert int(row["n_seeds"]) == 3 and row["seeds"] == ";".join(map(str, seeds))
        for m in ("heldout/pass_at_1", "heldout/pass_at_8", "train/pass_at_1"):
            fin = [s[f"final/{m}"] for s in summ]
            start = [s[f"start/{m}"] for s in summ]
            mean, half = _ci(fin)
            assert float(row[f"{m}/final_mean"]) == pytest.approx(mean, abs=6e-4)
            assert float(row[f"{m}/final_ci95"]) == pytest.approx(half, abs=6e-4)
            assert float(row[f"{m}/start_mean"]) == pytest.approx(np.mean(start), abs=6e-4)
            d_mean, d_half = _ci(np.subtract(fin, start))
            assert float(row[f"{m}/delta_start_mean"]) == pytest.approx(d_mean, abs=6e-4)
            assert float(row[f"{m}/delta_start_ci95"]) == pytest.approx(d_half, abs=6e-4)
        mean8 = [s["final/heldout/mean_at_8"] for s in summ]
        assert float(row["heldout/mean_at_8/final_mean"]) == pytest.approx(np.mean(mean8),
                                                                             abs=6e-6)
        assert int(row["heldout/mean_at_8/final_n"]) == 3
        assert float(row["tokens_total_mean"]) == pytest.approx(31000 + np.mean(seeds), abs=6e-4)
        assert float(row["wall_s_mean"]) == pytest.approx(60 + 5 * np.mean(seeds), abs=6e-4)
        assert float(row["wall_s_ci95"]) == pytest.approx(_ci([60 + 5 * s for s in seeds])[1],
                                                          abs=6e-6)
        assert float(row["peak_mem_mb_mean"]) == pytest.approx(900 + 10 * np.mean(seeds))
        assert float(row["steps_mean"]) == 30.0
        trained = [20000.0 + 100 * s for s in seeds] if alg == "dapo" else []
        assert int(row["tokens_trained_n"]) == len(trained)
        if trained:
            assert float(row["tokens_trained_mean"]) == pytest.approx(np.mean(trained))
        else:
            assert row["tokens_trained_mean"] == "nan"


def test_killed_runs_not_counted_and_duplicates_reported(store):
    rows = _rows(store)
    grpo_ids = rows["grpo"]["run_ids"].split(";")
    assert store["killed"] not in grpo_ids and store["stale"] not in grpo_ids
    assert grpo_ids == [store["runs"]["grpo", s][0] for s in SEEDS["grpo"]]
    md = (store["out"] / "countdown-tiny" / "tiny" / "leaderboard.md").read_text()
    assert "KILLED: 1" in md
    duplicates = md.split("## Duplicate runs\n", 1)[1].split("<details>", 1)[0]
    assert f"**grpo** seed 1: `{store['stale']}`, `{store['runs']['grpo', 1][0]}` (used)" \
        in duplicates
    assert "1 duplicate run(s) of a cell" in md


@pytest.mark.parametrize(("alg", "base", "shared"), [("dapo", "grpo", [0, 1, 2]),
                                                     ("drgrpo", "dapo", [1, 2])])
def test_paired_differences_on_shared_seeds(store, alg, base, shared):
    row = _rows(store)[alg]
    assert row["baseline"] == base
    for m in ("heldout/pass_at_1", "heldout/pass_at_8"):
        diffs = [store["runs"][alg, s][1][f"final/{m}"] - store["runs"][base, s][1][f"final/{m}"]
                 for s in shared]
        mean, half = _ci(diffs)
        assert int(row[f"{m}/vs_baseline_pairs"]) == len(shared)
        assert float(row[f"{m}/vs_baseline_mean"]) == pytest.approx(mean, abs=6e-4)
        assert float(row[f"{m}/vs_baseline_ci95"]) == pytest.approx(half, abs=6e-4)
        # the uncorrected paired t-test's p stays in the CSV; Holm's adjustment is gone
        assert float(row[f"{m}/vs_baseline_p"]) == pytest.approx(
            stats.ttest_1samp(diffs, 0.0).pvalue, abs=2e-6)
        assert f"{m}/vs_baseline_p_holm" not in row


def test_final_token_entropy_is_mean_of_last_ten_steps_and_paired(store):
    rows = _rows(store)
    for alg, seeds in SEEDS.items():
        late = [store["runs"][alg, s][1]["entropy_last10"] for s in seeds]
        mean, half = _ci(late)
        assert float(rows[alg]["token_entropy/final_mean"]) == pytest.approx(mean, abs=6e-6)
        assert float(rows[alg]["token_entropy/final_ci95"]) == pytest.approx(half, abs=6e-6)
    diffs = [store["runs"]["dapo", s][1]["entropy_last10"]
             - store["runs"]["grpo", s][1]["entropy_last10"] for s in SEEDS["dapo"]]
    assert float(rows["dapo"]["token_entropy/vs_baseline_mean"]) == pytest.approx(
        np.mean(diffs), abs=6e-6)
    assert rows["dapo"]["token_entropy/vs_baseline_pairs"] == "3"
    quality = _md_table(store, "Quality (final)")
    assert quality["grpo"]["final token entropy"].split(" ")[0] == \
        f"{float(rows['grpo']['token_entropy/final_mean']):.3f}"
    assert "**" not in quality["dapo"]["final token entropy"]  # entropy is never "best"
    paired = _md_table(store, PAIRED)
    assert paired["dapo"]["Δ final token entropy"].startswith("+0.2")  # dapo's curves sit 0.2 up


def test_tool_calls_per_traj_is_the_last_evaluation_averaged_over_eval_sets(store):
    rows = _rows(store)
    for alg, seeds in SEEDS.items():
        summ = [store["runs"][alg, s][1] for s in seeds]
        # the rules differ on this data: the last evaluation is not the mean of the last two
        assert all(abs(x["tools_last"] - x["tools_last2"]) > 1e-3 for x in summ)
        mean, half = _ci([x["tools_last"] for x in summ])
        assert float(rows[alg]["tool_calls_per_traj/final_mean"]) == pytest.approx(mean,
                                                                                     abs=6e-6)
        assert float(rows[alg]["tool_calls_per_traj/final_ci95"]) == pytest.approx(half,
                                                                                     abs=6e-6)
    quality = _md_table(store, "Quality (final)")
    assert "**" not in quality["grpo"]["tool calls per trajectory"]


def test_baseline_row_has_no_paired_difference(store):
    rows = _rows(store)
    row = rows["grpo"]
    assert row["baseline"] == "" and row["heldout/pass_at_1/vs_baseline_pairs"] == "0"
    assert row["heldout/pass_at_1/vs_baseline_excludes_zero"] == "0"
    paired = _md_table(store, PAIRED)
    assert paired["grpo"]["baseline"] == "—"
    assert paired["grpo"]["Δ heldout pass@1"] == "—"
    assert paired["dapo"]["baseline"] == "grpo" and paired["drgrpo"]["baseline"] == "dapo"
    # nor a primary comparison: one per row that has a baseline, against that baseline
    assert all(row[f"primary_{c}"] == "" for c in PRIMARY_COLUMNS)
    primary = _md_table(store, "Primary comparisons")
    assert {k: r["baseline"] for k, r in primary.items()} == {"dapo": "grpo", "drgrpo": "dapo"}
    for alg in ("dapo", "drgrpo"):
        assert all(rows[alg][f"primary_{c}"] != "" for c in PRIMARY_COLUMNS)
        assert float(rows[alg]["primary_estimate"]) == pytest.approx(
            float(primary[alg]["Δ"]), abs=6e-4)


def test_markdown_header_and_traceability(store):
    md = (store["out"] / "countdown-tiny" / "tiny" / "leaderboard.md").read_text()
    assert md.startswith("# countdown-tiny / tiny\n")
    assert "Generated by `rlbench board`" in md and "Experiment: `rlbench`" in md
    assert "Tracking URI: `sqlite:///mlruns.db`" in md  # relative to the out dir's parent
    assert str(store["root"]) not in md
    assert "rlbench board --tracking-uri sqlite:///mlruns.db --experiment rlbench" in md
    assert "unbiased Codex estimator" in md and "Student-t 95%" in md
    assert "Pairing config: `conf/board/default.yaml`; default baseline `grpo`" in md
    assert "Generated from 10 finished runs (1 duplicates)" in md
    assert "- Primary metric: heldout pass@1 (last evaluation).\n" in md
    # the plan and its verdict come before any table; no sweep declares an effect to detect
    first_table = md.index("\n## ")
    assert md.index("- **Descriptive only**: no effect to detect is declared for sweep(s) (none) "
                    "(plan.detect in conf/board/default.yaml).\n") < first_table
    assert md.index("- Analysis plan (declared in `conf/board/default.yaml`): primary metric "
                    "heldout pass@1 of each run's last evaluation; one comparison per row "
                    "against its baseline;") < first_table
    assert "**Confirmatory**" not in md
    # the confirmatory section sits between the quality table and the descriptive differences
    assert md.index("## Quality (final)\n") < md.index("## Primary comparisons\n") < \
        md.index(f"## {PAIRED}\n")
    assert "Holm" not in md and "†" not in md and "‡" not in md
    for run_id, _ in store["runs"].values():
        assert run_id in md
    readme = (store["out"] / "README.md").read_text()
    line = next(x for x in readme.splitlines() if "(countdown-tiny/tiny/leaderboard.md)" in x)
    # the top row by mean is named as such, never "best", beside the plan's verdict
    assert "highest mean heldout pass@1: **drgrpo**" in line and "best" not in line
    assert re.search(r" \(3\); descriptive only; 3 rows, 9 runs$", line)
    # the index names the command, the git commit and the date of every leaderboard
    entry = readme.split("(countdown-tiny/tiny/leaderboard.md)")[1]
    assert "made by `rlbench board --tracking-uri sqlite:///mlruns.db --experiment rlbench" in entry
    assert re.search(r"at commit `([0-9a-f]{40}|unknown)[^`]*` on \d{4}-\d{2}-\d{2}", entry)
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent).stdout.strip()
    if head:
        assert f"commit `{head}" in readme


def _undated(data: bytes) -> bytes:
    return re.sub(rb"\d{4}-\d{2}-\d{2}", b"<date>", data)


@pytest.mark.slow
def test_regeneration_is_byte_identical(store):
    """Everything but the README's date is deterministic, the leaderboard runs logged to MLflow
    are not mistaken for training runs, and each rebuild replaces the group's leaderboard run."""
    client = MlflowClient(store["uri"])
    exp_id = client.get_experiment_by_name("rlbench").experiment_id
    before = {p: p.read_bytes() for p in store["files"]}
    (old,) = client.search_runs([exp_id], f"tags.`{KIND_TAG}` = '{LEADERBOARD}'")
    assert build_leaderboards(store["uri"], "rlbench", store["out"], baseline="grpo") == \
        store["files"]
    after = {p: p.read_bytes() for p in store["files"]}
    readme = store["out"] / "README.md"
    assert _undated(after.pop(readme)) == _undated(before.pop(readme))
    assert after == before
    (new,) = client.search_runs([exp_id], f"tags.`{KIND_TAG}` = '{LEADERBOARD}'")
    assert new.info.run_id != old.info.run_id
    assert client.get_run(old.info.run_id).info.lifecycle_stage == "deleted"


@pytest.mark.slow
def test_source_date_epoch_fixes_the_date(store, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "86400")  # 1970-01-02
    out = store["root"] / "dated"
    build_leaderboards(store["uri"], "rlbench", out, log_to_mlflow=False)
    assert "on 1970-01-02" in (out / "README.md").read_text()


def test_unknown_experiment_lists_existing(store):
    with pytest.raises(ValueError, match="nope") as err:
        build_leaderboards(store["uri"], "nope", store["root"] / "x")
    for name in ("'rlbench'", "'only-killed'", "'Default'"):
        assert name in str(err.value)


def test_experiment_without_finished_runs(store):
    with pytest.raises(ValueError, match=r"no FINISHED runs \(1 run\(s\) in other statuses"):
        build_leaderboards(store["uri"], "only-killed", store["root"] / "x")


def test_display_tracking_uri_strips_credentials(tmp_path):
    uri = "postgresql://alice:s3cret@db.example.com:5432/mlflow?sslmode=require&password=pw"
    shown = display_tracking_uri(uri, tmp_path)
    assert shown == "postgresql://db.example.com:5432/mlflow?sslmode=require"
    assert display_tracking_uri(f"sqlite:///{tmp_path / 'a' / 'm.db'}", tmp_path) == \
        "sqlite:///a/m.db"
    assert display_tracking_uri("sqlite:////elsewhere/m.db", tmp_path) == "sqlite:///m.db"


def test_align_shared_steps_then_interpolation():
    steps, vals = _align([{0: 0.0, 10: 1.0, 20: 2.0}, {0: 0.5, 5: 9.0, 10: 1.5, 20: 2.5}])
    assert steps.tolist() == [0, 10, 20] and vals.tolist() == [[0, 1, 2], [0.5, 1.5, 2.5]]
    steps, vals = _align([{0: 0.0, 10: 1.0}, {5: 1.0, 15: 2.0}])  # no two shared steps
    assert steps.tolist() == [5, 10] and vals.tolist() == [[0.5, 1.0], [1.0, 1.5]]


def test_cells_mean_ci_n_and_bold_best(store):
    """Each quality cell is "mean ± half (n)" from the CSV's numbers; exactly the best mean of
    each column is bold; cost columns bold their lowest mean."""
    rows, quality = _rows(store), _md_table(store, "Quality (final)")
    assert [r["#"] for r in quality.values()] == ["1", "2", "3"]
    for m, title in (("heldout/pass_at_1", "heldout pass@1"),
                     ("heldout/pass_at_8", "heldout pass@8"),
                     ("heldout/mean_at_8", "heldout mean@8"), ("train/pass_at_1", "train pass@1")):
        best = max(rows, key=lambda a: float(rows[a][f"{m}/final_mean"]))
        for alg, row in rows.items():
            text = (f"{float(row[f'{m}/final_mean']):.3f} ± {float(row[f'{m}/final_ci95']):.3f} "
                    f"({row[f'{m}/final_n']})")
            assert quality[alg][title] == (f"**{text}**" if alg == best else text)
    assert "heldout pass@8" in quality["grpo"] and "train pass@1" in quality["grpo"]
    cost = _md_table(store, "Cost")
    assert cost["dapo"]["tokens trained"].startswith("**20,100 ± ")
    assert cost["grpo"]["tokens trained"] == "—"
    lowest = min(float(r["wall_s_mean"]) for r in rows.values())  # grpo and dapo tie: both bold
    assert [a for a in cost if cost[a]["wall s"].startswith("**")] == \
        [a for a in rows if float(rows[a]["wall_s_mean"]) == lowest] == ["dapo", "grpo"]
    assert not any(c["steps"].startswith("**") for c in cost.values())  # steps: not a cost
    assert "peak mem MiB" in cost["grpo"] and "peak GPU mem MiB" not in cost["grpo"]


def test_change_since_start_table(store):
    rows, start = _rows(store), _md_table(store, "Change since step 0")
    row = rows["dapo"]
    m = "heldout/pass_at_1"
    assert start["dapo"]["heldout pass@1"] == (
        f"{float(row[f'{m}/start_mean']):.3f} → {float(row[f'{m}/delta_start_mean']):+.3f} ± "
        f"{float(row[f'{m}/delta_start_ci95']):.3f} (3)")
    # the baseline's learning check follows the table, on the page
    md = (store["out"] / "countdown-tiny" / "tiny" / "leaderboard.md").read_text()
    section = md.split("## Change since step 0")[1].split("## Step size")[0]
    assert "- Learning check: baseline `grpo`, heldout pass@1: above its step-0 value" in section


def test_leaderboard_logged_to_mlflow(store, tmp_path):
    """One leaderboard run per group, ignored as a training run, holding the table, pages and
    curves, with the run ids behind each row."""
    client = MlflowClient(store["uri"])
    exp_id = client.get_experiment_by_name("rlbench").experiment_id
    (run,) = client.search_runs([exp_id], f"tags.`{KIND_TAG}` = '{LEADERBOARD}'")
    tags = run.data.tags
    assert (tags["rlbench.task"], tags["rlbench.task_variant"], tags["rlbench.model"]) == \
        ("countdown", "tiny", "tiny")
    assert run.info.status == "FINISHED"
    for alg, seeds in SEEDS.items():
        expected = ",".join(f"{s}:{store['runs'][alg, s][0]}" for s in seeds)
        assert tags[f"rlbench.leaderboard.runs.{alg}"] == expected
    arts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"leaderboard.md", "leaderboard.csv", "leaderboard_table.json", "runs.json",
            "heldout-pass_at_1.png", "entropy.png", "reward.png", "response_len.png"} <= arts
    # an MLflow table (client.load_table reads the global tracking URI, so read the file)
    assert {"path": "leaderboard_table.json", "type": "table"} in \
        json.loads(tags["mlflow.loggedArtifacts"])
    path = client.download_artifacts(run.info.run_id, "leaderboard_table.json", str(tmp_path))
    split = json.loads(Path(path).read_text())  # pandas "split" orientation
    df = [dict(zip(split["columns"], values)) for values in split["data"]]
    assert [r["row"] for r in df] == ["drgrpo", "dapo", "grpo"]
    rows = _rows(store)
    assert [r["heldout/pass_at_1/final_mean"] for r in df] == pytest.approx(
        [float(rows[a]["heldout/pass_at_1/final_mean"]) for a in ("drgrpo", "dapo", "grpo")])
    assert [r["heldout/pass_at_1/vs_baseline_pairs"] for r in df] == [2, 3, 0]
    assert run.data.params["baseline"] == "grpo"


def test_index_line_names_the_top_mean_and_counts_only_significant_primary_comparisons():
    """The index names the top row by mean and counts the primary comparisons significant under
    the plan (not the secondary paired intervals), or says the board is descriptive only."""
    from harness.report.analysis import Analysis, Comparison
    from harness.report.board import _summary
    from harness.report.stats import interval
    from harness.report.tables import Row, Spec
    from harness.report.verdict import Verdict

    spec = Spec("heldout", "pass", 1)

    def row(key: str, values: list[float], vs: dict) -> Row:
        r = Row(key=key, label=key, algorithm=key, variant="", temperature="1.0", runs={})
        r.final[spec.name], r.vs = interval(values), vs
        return r

    def comp(key: str, low: float, high: float, mde: float) -> Comparison:
        p = 0.01 if low > 0 or high < 0 else 0.5  # significant: adjusted p below alpha
        return Comparison(key, "grpo", 2, (low + high) / 2, 0.01, 1.0, p, low, high, mde)

    # rloo's secondary pass@8 interval excludes 0, its primary comparison does not: not counted
    top = row("dapo", [0.3, 0.31], {spec.name: interval([0.1, 0.11])})
    other = row("rloo", [0.25, 0.26], {"heldout/pass_at_8": interval([0.1, 0.11])})
    base = row("grpo", [0.2, 0.21], {})
    comps = [comp("dapo", 0.01, 0.05, 0.04), comp("rloo", -0.02, 0.03, 0.05)]
    confirmatory = Verdict(spec, Analysis(comparisons=comps), detect=0.1)
    assert confirmatory.confirmatory
    line = _summary([top, other, base], spec, confirmatory)
    assert line.startswith("highest mean heldout pass@1: **dapo** 0.305 ± ")
    assert line.endswith("; 1 of 2 primary comparisons significant (seed-blocked, "
                         "Dunnett-adjusted; MDE 0.050)")
    assert "best" not in line
    descriptive = Verdict(spec, Analysis(comparisons=comps), descriptive="no effect declared")
    assert _summary([top, other, base], spec, descriptive).endswith("(2); descriptive only")
    assert _summary([base], spec, confirmatory).startswith(
        "one row, **grpo**: heldout pass@1 0.205")
