"""A board whose declared primary is an evaluation metric other than pass/mean/maj@k, lower is
better (issue 36: tool calls per answer, the ARPO/AEPO claim). Runs log it only per evaluation
(``eval/heldout/tool_calls_per_traj``; a run's summary keeps quality metrics), so the board reads
its last evaluation and step 0 from the history; it ranks lowest first, tests and marks as for
pass@1, tests its controls in their declared direction, and the claims ledger reads the page.
Also the plan's refusals of a direction it cannot hold. On synthetic MLflow runs."""

from __future__ import annotations

import csv
import functools

import pytest
from mlflow.entities import Metric, Param

from harness.report.board import build_leaderboards as _build
from harness.report.claims_ledger import NOT_SHOWN, SHOWN, judge_claim, load_claims
from harness.report.config import BoardError, load_config
from harness.tracking import open_client

build_leaderboards = functools.partial(_build, allow_dirty=True, log_to_mlflow=False,
                                       export=False)
SEEDS = (0, 1, 2, 3, 4, 5)
NOISE = (0.02, -0.015, 0.005, -0.01, 0.015, -0.005)  # per seed, every row alike
CALLS = {"grpo": 1.0, "arpo": 0.7, "aepo": 1.0, "grpo@both_hops": 1.6, "grpo@aa": 1.0}
PLAN = ("plan: {primary: heldout/tool_calls_per_traj, better: lower, detect: {decide: 0.1}, "
        "controls: {decide: {positive: grpo@both_hops, aa: grpo@aa, direction: above}}}\n")


def _calls(label: str, i: int) -> float:
    jitter = 0.002 * ((i * 7 + 3 * list(CALLS).index(label)) % 5)
    own = NOISE[::-1][i] if label == "grpo@aa" else NOISE[i]  # the A/A row's seeds are its own
    return CALLS[label] + own + jitter


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("lower")
    uri = f"sqlite:///{root / 'mlruns.db'}"
    client = open_client(uri)
    exp = client.create_experiment("decide", artifact_location=(root / "art").as_uri())
    for n, (label, (i, block)) in enumerate(
            (lab, ib) for lab in CALLS for ib in enumerate(SEEDS)):
        alg, _, variant = label.partition("@")
        seed = 200 + block if variant == "aa" else block
        tags = {"rlbench.algorithm": alg, "rlbench.task": "agentic_qa",
                "rlbench.task_variant": "tiny", "rlbench.model": "tiny",
                "rlbench.temperature": "1.0", "rlbench.seed": str(block),
                "rlbench.train_seed": str(seed), "rlbench.sweep": "decide"}
        params = [Param("seed", str(seed)), Param("algorithm.name", alg)]
        if variant:
            tags["rlbench.variant"] = variant
            params.append(Param("block_seed", str(block) if variant == "aa" else "None"))
        rid = client.create_run(exp, start_time=n, tags=tags).info.run_id
        client.log_batch(rid, params=params, metrics=[
            Metric("eval/heldout/tool_calls_per_traj", 1.0 + 0.01 * block, 0, 0),
            Metric("eval/heldout/tool_calls_per_traj", 3.0, 0, 8),  # mid-training: not read
            Metric("eval/heldout/tool_calls_per_traj", _calls(label, i), 0, 16),
            Metric("eval/heldout/pass_at_1", 0.6, 0, 16),
            Metric("final/heldout/pass_at_1", 0.6 + 0.001 * i, 0, 16),
            Metric("start/heldout/pass_at_1", 0.55, 0, 16),
            Metric("rollout/tokens_total", 100.0, 0, 16)])
        client.set_terminated(rid, "FINISHED")
    cfg = root / "board.yaml"
    cfg.write_text("baseline: grpo\nvariant: [tags.rlbench.variant]\n" + PLAN)
    out = root / "leaderboards" / "decide"
    build_leaderboards(uri, "decide", out, config=cfg)
    page = out / "agentic_qa-tiny" / "tiny"
    with open(page / "leaderboard.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return root, uri, cfg, rows, (page / "leaderboard.md").read_text(), \
        (out / "README.md").read_text()


def test_the_primary_is_each_runs_last_evaluation_read_from_its_history(store):
    rows = {r["row"]: r for r in store[3]}
    col = "heldout/tool_calls_per_traj"
    for label in CALLS:
        want = sum(_calls(label, i) for i in range(len(SEEDS))) / len(SEEDS)
        assert float(rows[label][f"{col}/final_mean"]) == pytest.approx(want, abs=1e-6)
        assert float(rows[label][f"{col}/start_mean"]) == pytest.approx(1.025, abs=1e-6)
    assert float(rows["arpo"][f"{col}/vs_baseline_mean"]) == pytest.approx(-0.3, abs=0.01)


def test_rows_rank_lowest_first_and_the_index_says_lowest(store):
    rows, md, readme = store[3], store[4], store[5]
    method = [r["row"] for r in rows if not r.get("control")]
    assert method == ["arpo", "grpo", "aepo"]
    assert "lowest mean heldout tool_calls_per_traj: **arpo**" in readme
    assert "- Primary metric: heldout tool_calls_per_traj (last evaluation)." in md
    assert "primary metric heldout tool_calls_per_traj (lower is better)" in md
    # the quality table bolds the lowest mean of the lower-is-better column
    assert "**0.7" in md.split("| arpo |", 1)[1].split("\n", 1)[0]


def test_fewer_calls_are_a_significant_negative_estimate_and_the_best_comparison_first(store):
    rows, md = {r["row"]: r for r in store[3]}, store[4]
    assert "**Confirmatory**" in md
    arpo, aepo = rows["arpo"], rows["aepo"]
    assert float(arpo["primary_estimate"]) == pytest.approx(-0.3, abs=0.01)
    assert arpo["primary_significant"] == "1" and aepo["primary_significant"] == "0"
    table = md.split("## Primary comparisons", 1)[1]
    assert table.index("| arpo |") < table.index("| aepo |")


def test_an_over_searching_control_is_detected_above_and_the_aa_control_is_not(store):
    rows = {r["row"]: r for r in store[3]}
    assert (rows["grpo@both_hops"]["control_result"], rows["grpo@both_hops"]["control_passed"]) \
        == ("detected", "1")
    assert (rows["grpo@aa"]["control_result"], rows["grpo@aa"]["control_passed"]) == \
        ("not detected", "1")
    assert "Controls: **controls passed**" in store[4]


def test_the_ledger_reads_a_claim_of_fewer_calls_from_the_page(store):
    """The claim's percent is read against the baseline row's mean on the page, in the lower
    direction: ARPO's 30% fewer calls, significant, is shown; AEPO, powered and flat, is not."""
    root = store[0]
    (root / "docs" / "claims").mkdir(parents=True, exist_ok=True)
    (root / "docs" / "claims" / "arpo.yaml").write_text("""
paper: "A 2025"
methods: [arpo]
claim: "fewer calls"
claim_number: 50
claim_unit: "percent fewer tool calls per answer than GRPO"
testbed: {sweep: decide, status: existing, why: "calls vary"}
primary: {metric: heldout/tool_calls_per_traj, comparison: "arpo vs grpo", test: "Dunnett"}
powered_for: {effect: 0.1, seeds: 6, source: "a pilot"}
controls: {positive: "over-searching", aa: "grpo on other seeds"}
cannot_show: "much"
gpu_only: false
evidence:
  - board: leaderboards/decide/agentic_qa-tiny/tiny
    rows: [arpo, aepo]
    metric: heldout/tool_calls_per_traj
""")
    claims, pages = load_claims(root)
    result, _, blocks = judge_claim(claims[0], pages)
    (_, _, ctext, note, readings) = blocks[0]
    assert not note, note  # the page's controls passed: its rows decide
    assert ctext.startswith("50% below `grpo`'s mean on this page, 1.0")
    assert [(r.row, r.result) for r in readings] == [("arpo", SHOWN), ("aepo", NOT_SHOWN)]
    assert result == SHOWN


@pytest.mark.parametrize(("plan", "said"), [
    ("{primary: heldout/pass_at_1, better: lower}", "plan.better: lower with primary"),
    ("{better: lower}", "plan.better: lower with primary (the first pass@1)"),
    ("{primary: heldout/tool_calls_per_traj}", "declare plan.better"),
    ("{primary: tool_calls_per_traj, better: lower}", "name it <eval set>/<metric>"),
    ("{primary: heldout/tool_calls_per_traj, better: fewer}", "plan.better must be lower or"),
    ("{primary: heldout/tool_calls_per_traj, better: lower, read: budget}",
     "is read at the last evaluation"),
])
def test_a_direction_the_plan_cannot_hold_is_refused_naming_the_key(tmp_path, plan, said):
    cfg = tmp_path / "b.yaml"
    cfg.write_text(f"plan: {plan}\n")
    with pytest.raises(BoardError, match=None) as err:
        load_config(cfg)
    assert said in str(err.value)


def test_a_declared_evaluation_metric_no_run_logged_is_one_board_error(store, tmp_path):
    _, uri, *_ = store
    cfg = tmp_path / "b.yaml"
    cfg.write_text("plan: {primary: heldout/calls_over_needed, better: lower}\n")
    with pytest.raises(BoardError, match=r"heldout/calls_over_needed.*was not logged"):
        build_leaderboards(uri, "decide", tmp_path / "out", config=cfg)
