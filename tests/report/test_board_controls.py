"""Sensitivity controls on a board (issue 36): a positive control (a handicapped baseline) must be
detected and an A/A control (the baseline on seeds of its own, paired by ``block_seed``) must
not; both are declared per sweep in the board config (``plan.controls``), tested against their
baseline alone and reported apart, so the method rows' test is the one a board without them
gives. On synthetic MLflow runs; the config key ``block_seed``, the trainer's seed tags, the
config hash and the off-policy testbed's control sweeps on the real configs."""

from __future__ import annotations

import csv
import functools
import re

import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from harness.cell_plan import config_hash
from harness.cli.hydra_app import expand_cells
from harness.config import CONF_DIR, compose_config, validate_config
from harness.report.board import build_leaderboards as _build
from harness.report.config import BoardError, load_config
from harness.report.provenance import reproduce
from harness.report.tables import Run
from harness.tracking import open_client, seed_tags

build_leaderboards = functools.partial(_build, allow_dirty=True, log_to_mlflow=False,
                                       export=False)
SEEDS = (0, 1, 2, 3, 4, 5)
AA_SEEDS = tuple(200 + s for s in SEEDS)  # trained with; paired on block_seed = seed - 200
TUNING = (100, 101)  # the tuning seeds of a board that selects the learning rate
NOISE = (0.004, -0.003, 0.001, -0.002, 0.003, -0.001)  # per training seed 0-5, every row alike
AA_NOISE = (-0.002, 0.003, 0.000, 0.004, -0.003, -0.001)  # per training seed 200-205: its own
EFFECT = {"grpo": 0.0, "dapo": 0.06, "rloo": 0.003, "grpo@lr_div10": -0.08, "grpo@aa": 0.0}
METHODS = ("grpo", "dapo", "rloo")
CONTROLS = ("grpo@lr_div10", "grpo@aa")
DECLARED = "controls: {reported: {positive: grpo@lr_div10, aa: grpo@aa}}"


def _held(label: str, i: int, effect: dict[str, float]) -> float:
    """Row ``label``'s final score at block ``i``: the training seed's noise (the A/A row's own
    seeds have their own), the row's effect, and a small per-cell jitter (residual variance)."""
    noise = AA_NOISE if label == "grpo@aa" else NOISE
    return 0.2 + effect[label] + noise[i] + 0.0005 * ((i * 7 + 2 * list(EFFECT).index(label)) % 5)


def _experiment(client: MlflowClient, name: str, root, labels, effect=EFFECT,
                tuned: bool = False, entropy: dict[str, float] | None = None) -> None:
    """Runs of ``labels`` on the blocks ``SEEDS``; ``tuned``: also the method rows' tuning runs
    (seeds 100 and 101 at two rates, 1e-4 winning on validation), as the off-policy testbed's;
    ``entropy``: each row's shift of its logged token entropy (``rollout/entropy``)."""
    exp = client.create_experiment(name, artifact_location=(root / name).as_uri())
    n = 0
    for label in METHODS if tuned else ():
        for seed in TUNING:
            for lr, valid in (("0.0001", 0.3), ("0.001", 0.1)):
                rid = client.create_run(exp, start_time=n, tags={
                    "rlbench.algorithm": label, "rlbench.task": "countdown",
                    "rlbench.task_variant": "tiny", "rlbench.model": "tiny",
                    "rlbench.temperature": "1.0", "rlbench.seed": str(seed),
                    "rlbench.sweep": "tuning"}).info.run_id
                n += 1
                client.log_batch(rid, params=[Param("seed", str(seed)),
                                              Param("algorithm.name", label),
                                              Param("trainer.optim.lr", lr)],
                                 metrics=[Metric("final/validation/pass_at_1", valid, 0, 20),
                                          Metric("final/heldout/pass_at_1", 0.2, 0, 20)])
                client.set_terminated(rid, "FINISHED")
    entropy_effect = {**dict.fromkeys(EFFECT, 0.0), **(entropy or {})}
    for label in labels:
        alg, _, variant = label.partition("@")
        for i, block in enumerate(SEEDS):
            seed = AA_SEEDS[i] if variant == "aa" else block
            held = _held(label, i, effect)
            tags = {"rlbench.algorithm": alg, "rlbench.task": "countdown",
                    "rlbench.task_variant": "tiny", "rlbench.model": "tiny",
                    "rlbench.temperature": "1.0", **seed_tags(_Cfg(seed, block)),
                    "rlbench.sweep": "controls" if variant else "reported"}
            params = {"seed": seed, "algorithm.name": alg,
                      "trainer.optim.lr": "1e-05" if variant == "lr_div10" else "0.0001"}
            if variant:
                tags["rlbench.variant"] = variant
                params["block_seed"] = block if variant == "aa" else None
            rid = client.create_run(exp, start_time=1000 + n, tags=tags).info.run_id
            n += 1
            client.log_batch(rid, params=[Param(k, str(v)) for k, v in params.items()], metrics=[
                Metric("eval/heldout/pass_at_1", 0.15, 0, 0),
                Metric("eval/heldout/pass_at_1", held, 0, 20),
                Metric("final/heldout/pass_at_1", held, 0, 20),
                Metric("start/heldout/pass_at_1", 0.15 + 0.001 * block, 0, 20),
                Metric("final/validation/pass_at_1", held, 0, 20),
                Metric("rollout/tokens_total", 200.0, 0, 20),
                *[Metric("rollout/entropy", _held(label, i, entropy_effect) + 0.1, 0, step)
                  for step in range(10, 21) if entropy is not None]])
            client.set_terminated(rid, "FINISHED")


class _Cfg(dict):
    """The two keys of a run config :func:`seed_tags` reads (``block_seed`` set for A/A)."""

    def __init__(self, seed: int, block: int):
        super().__init__(seed=seed, block_seed=None if seed == block else block)
        self.seed = seed


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("controls")
    uri = f"sqlite:///{root / 'mlruns.db'}"
    client = open_client(uri)
    _experiment(client, "full", root, (*METHODS, *CONTROLS))
    _experiment(client, "bare", root, METHODS)
    _experiment(client, "no_aa", root, (*METHODS, "grpo@lr_div10"))
    # a handicap that handicaps nothing, and an "A/A" that differs from its baseline
    _experiment(client, "failing", root, (*METHODS, *CONTROLS),
                effect={**EFFECT, "grpo@lr_div10": 0.0, "grpo@aa": 0.05})
    _experiment(client, "tuned", root, (*METHODS, *CONTROLS), tuned=True)
    # a push on entropy that leaves pass@1 alone (the entropy testbed's bonus control)
    _experiment(client, "entropy", root, (*METHODS, *CONTROLS),
                effect={**EFFECT, "grpo@lr_div10": 0.0}, entropy={"grpo@lr_div10": 0.05})
    return root, uri


_BUILT: dict[tuple[str, str], tuple[dict, str]] = {}


def _board(store, experiment: str, controls: str = DECLARED, select: bool = False
           ) -> tuple[dict, str]:
    """(CSV rows by row, page) of ``experiment`` under a plan with ``controls`` (cached);
    ``select``: each row's learning rate chosen on the tuning seeds."""
    if (experiment, controls) in _BUILT:
        return _BUILT[experiment, controls]
    root, uri = store
    name = f"{experiment}-{len(_BUILT)}"
    cfg = root / f"{name}.yaml"
    cfg.write_text("baseline: grpo\nvariant: [tags.rlbench.variant]\n"
                   + ("select: {key: params.trainer.optim.lr, metric: validation/pass_at_1, "
                      f"seeds: {list(TUNING)}}}\n" if select else "")
                   + "plan: {primary: heldout/pass_at_1, detect: {reported: 0.1}"
                   + (f", {controls}" if controls else "") + "}\n")
    build_leaderboards(uri, experiment, root / name, config=cfg)
    page = root / name / "countdown-tiny" / "tiny"
    with open(page / "leaderboard.csv", newline="") as f:
        rows = {r["row"]: r for r in csv.DictReader(f)}
    _BUILT[experiment, controls] = rows, (page / "leaderboard.md").read_text()
    return _BUILT[experiment, controls]


def _section(md: str, title: str) -> str:
    return md.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


# -- block_seed: the A/A row's own seeds on the baseline's blocks ---------------------------------
@pytest.mark.slow
def test_block_seed_pairs_an_aa_run_with_the_baseline_run_of_its_block(store):
    rows, md = _board(store, "full")
    aa = rows["grpo@aa"]
    assert aa["seeds"] == rows["grpo"]["seeds"] == ";".join(map(str, SEEDS))
    assert aa["heldout/pass_at_1/vs_baseline_pairs"] == str(len(SEEDS))
    # one row despite block_seed (and seed) differing between its runs; the page says which
    # seed each run trained with
    assert "seed 0 (trained with seed 200): `" in md
    assert "(trained with seed" not in md.split("- **grpo** (temperature", 1)[1].split("\n")[0]


def test_trainer_tags_the_block_and_keeps_the_seed_it_trained_with():
    cfg = compose_config(["seed=203", "block_seed=3"])
    assert seed_tags(cfg) == {"rlbench.seed": "3", "rlbench.train_seed": "203"}
    assert seed_tags(compose_config(["seed=7"])) == {"rlbench.seed": "7",
                                                    "rlbench.train_seed": "7"}


def test_an_aa_cell_is_its_own_cell_and_an_unset_block_seed_leaves_hashes_as_they_were():
    base = {"seed": 0, "trainer": {"lr": 1.0}}
    assert config_hash({**base, "block_seed": None}) == config_hash(base)  # runs made before
    aa = config_hash({**base, "seed": 200, "block_seed": 0})
    assert aa != config_hash(base)  # GRPO seed 0, the run it is paired with
    assert aa != config_hash({**base, "seed": 200})  # a plain run of seed 200 is not an A/A run


@pytest.mark.parametrize(("value", "needle"), [
    ("-1", "block_seed must be a seed label >= 0"),
    ("abc", "block_seed='abc'"),
])
def test_a_bad_block_seed_is_one_line_and_exit_2(value, needle, tmp_path, rlbench_in_process):
    out = rlbench_in_process("train", f"block_seed={value}", cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("rlbench: error:")]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in out.stderr


# -- the controls' verdicts ---------------------------------------------------------------------
def test_a_handicap_is_detected_and_an_aa_control_is_not(store):
    rows, md = _board(store, "full")
    pos, aa = rows["grpo@lr_div10"], rows["grpo@aa"]
    assert (pos["control"], pos["control_result"], pos["control_passed"]) == \
        ("positive", "detected", "1")
    assert (aa["control"], aa["control_result"], aa["control_passed"]) == \
        ("aa", "not detected", "1")
    assert rows["dapo"]["control"] == rows["dapo"]["control_passed"] == ""
    # the usual primary columns hold each control's own test against its baseline
    assert float(pos["primary_estimate"]) == pytest.approx(-0.08, abs=0.002)
    assert pos["primary_significant"] == "1" and float(pos["primary_p_adjusted"]) < 0.05
    assert aa["primary_significant"] == "0" and float(aa["primary_p_adjusted"]) >= 0.05
    assert "- Controls: **controls passed**" in md
    assert md.index("## Controls") < md.index("## Primary comparisons")
    controls = _section(md, "Controls")
    assert re.search(r"\| positive control \| grpo@lr_div10 \| grpo \| 6 \| -0\.0[78]\d \|",
                     controls)
    assert "**detected** |" in controls and "**not detected** |" in controls
    assert "grpo@" not in _section(md, "Primary comparisons")  # reported apart


def test_controls_that_do_not_come_out_as_they_must_fail(store):
    rows, md = _board(store, "failing")
    assert rows["grpo@lr_div10"]["control_result"] == "not detected"
    assert rows["grpo@aa"]["control_result"] == "detected (false positive)"
    assert rows["grpo@lr_div10"]["control_passed"] == rows["grpo@aa"]["control_passed"] == "0"
    assert "- Controls: **controls failed**" in md


@pytest.mark.slow
def test_a_declared_control_without_runs_reads_controls_not_run(store):
    rows, md = _board(store, "no_aa")
    assert "- Controls: **controls not run**" in md
    assert "A/A control `grpo@aa` has no row on this page" in md
    assert "no row on this page: controls not run" in _section(md, "Controls")
    assert rows["grpo@lr_div10"]["control_passed"] == "1"  # the one that ran still reads
    _rows, bare = _board(store, "bare")
    assert "**controls not run**" in bare


def test_controls_leave_the_method_rows_test_as_it_is_without_them(store):
    """The A/A row's runs do not share their blocks' data order: in the method rows' model its
    residuals would change every SE and the critical value (docs/analysis.md, Controls)."""
    with_controls, _ = _board(store, "full")
    without, _ = _board(store, "bare", controls="")
    keys = [k for k in without["dapo"] if k.startswith("primary_")]
    assert len(keys) == 9
    for row in ("dapo", "rloo"):
        assert {k: with_controls[row][k] for k in keys} == {k: without[row][k] for k in keys}
    assert "control" not in without["dapo"]  # no controls declared: no control columns


@pytest.mark.slow
def test_a_block_seed_row_declared_as_no_control_is_left_out_of_the_test(store):
    rows, md = _board(store, "full", controls="")
    assert "## Controls" not in md
    assert "declared as no control: grpo@aa." in md
    assert rows["grpo@aa"]["primary_estimate"] == ""
    # the positive control, undeclared, is an ordinary row of the family
    assert rows["grpo@lr_div10"]["primary_estimate"] != ""


@pytest.mark.slow
def test_on_a_tuned_board_controls_are_not_selected_and_report_the_reported_seeds(store):
    rows, md = _board(store, "tuned", select=True)
    assert rows["grpo"]["selected"] == "0.0001"  # chosen on the tuning seeds
    # a control runs at a rate its sweep fixes from the baseline's choice: nothing to choose
    assert rows["grpo@lr_div10"]["selected"] == "1e-05"
    for label in CONTROLS:
        assert rows[label]["seeds"] == ";".join(map(str, SEEDS))
        assert f"| {label} |" not in _section(md, "Selection")
    assert "- Controls: **controls passed**" in md


ON_ENTROPY = ("controls: {reported: {positive: grpo@lr_div10, aa: grpo@aa, metric: token_entropy, "
              "direction: above}}")


@pytest.mark.slow
def test_a_control_declared_on_another_metric_is_tested_on_it_in_its_direction(store):
    """The entropy testbed's controls are about entropy, not pass@1: tested on the declared
    metric, the positive control detected in the declared direction; the same runs read on the
    primary, or with the direction reversed, do not pass."""
    rows, md = _board(store, "entropy", ON_ENTROPY)
    assert rows["grpo@lr_div10"]["control_result"] == "detected"
    assert rows["grpo@aa"]["control_result"] == "not detected"
    assert "- Controls: **controls passed**" in md
    assert "| positive control (on token_entropy, expected above) | grpo@lr_div10 |" in md
    assert "| A/A control (on token_entropy) | grpo@aa |" in md
    rows, md = _board(store, "entropy")  # on the primary: pass@1 did not move
    assert rows["grpo@lr_div10"]["control_result"] == "not detected"
    assert "- Controls: **controls failed**" in md
    rows, md = _board(store, "entropy", ON_ENTROPY.replace("above", "below"))
    assert rows["grpo@lr_div10"]["control_result"] == \
        "detected above its baseline (the wrong way)"
    assert "- Controls: **controls failed**" in md


def test_a_control_declared_on_a_metric_no_run_logged_is_one_board_error(store):
    """A declared control metric that neither the control nor its baseline logged is a
    configuration error naming the key and the metric, not a control silently not run."""
    with pytest.raises(BoardError, match=r"plan\.controls\.reported\.metric: 'tokn_entropy' "
                                         r"is not a final metric of the control runs"):
        _board(store, "entropy", ON_ENTROPY.replace("token_entropy", "tokn_entropy"))


def test_plan_controls_must_name_both_rows(tmp_path):
    for bad in ("{reported: {positive: grpo@lr_div10}}", "{reported: [grpo@aa]}",
                "{reported: {positive: grpo@aa, aa: grpo@aa}}",
                "{reported: {positive: grpo@lr_div10, aa: grpo@aa, direction: sideways}}",
                "{reported: {positive: grpo@lr_div10, aa: grpo@aa, metric: ''}}",
                "{reported: {positive: grpo@lr_div10, aa: grpo@aa, seeds: 3}}"):
        cfg = tmp_path / "bad.yaml"
        cfg.write_text(f"plan: {{controls: {bad}}}\n")
        with pytest.raises(BoardError, match=r"plan\.controls must map a sweep name"):
            load_config(cfg)


# -- the off-policy testbed's control sweeps ----------------------------------------------------
@pytest.mark.slow
def test_offpolicy_control_sweeps_make_the_rows_its_board_declares():
    declared = load_config(CONF_DIR / "board" / "offpolicy_tuned.yaml").plan.controls
    assert declared == {"testbed_offpolicy": {"positive": "grpo@lr_div10", "aa": "grpo@aa"}}
    reported = compose_config(["sweep=testbed_offpolicy", "algorithm=grpo", "seed=0"])
    for role, sweep in (("aa", "testbed_offpolicy_control_aa"),
                        ("positive", "testbed_offpolicy_control_lr_div10")):
        cells = expand_cells([f"sweep={sweep}"])
        assert len(cells) == 10  # seeds 0-9, or 200-209
        for cell in (cells[0], cells[-1]):
            cfg = compose_config(cell)
            validate_config(cfg, hardware=False)
            label = f"{cfg.algorithm.name}@{cfg.tracking.tags['rlbench.variant']}"
            assert label == declared["testbed_offpolicy"][role]
            assert cfg.tracking.experiment == reported.tracking.experiment
            assert cfg.task == reported.task and cfg.trainer.eval_every == 15
            tags = seed_tags(cfg)
            if role == "aa":  # its own seeds on the reported seeds' blocks
                assert cfg.seed >= 200 and tags["rlbench.seed"] == str(cfg.seed - 200)
                assert cfg.trainer.optim.lr == reported.trainer.optim.lr
            else:
                assert tags["rlbench.seed"] == str(cfg.seed) and cfg.seed < 10
                assert cfg.trainer.optim.lr == pytest.approx(reported.trainer.optim.lr / 10)


def test_a_board_of_a_testbed_and_its_control_sweeps_is_reproduced_by_all_of_them():
    def run(sweep: str, seed: int, *extra: str) -> Run:
        return Run("r", "grpo", "", str(seed), "1.0", "", {}, sweep=sweep, overrides=(
            "algorithm=grpo", "task=countdown", "model=tiny", "trainer=offpolicy",
            f"seed={seed}", f"sweep={sweep}", *extra))

    runs = [run("testbed_offpolicy", 0), run("testbed_offpolicy_control_aa", 200),
            run("testbed_offpolicy_control_lr_div10", 0)]
    line = reproduce(runs, "rlbench board --experiment e")
    assert ("`rlbench sweep sweep=testbed_offpolicy` and `rlbench sweep "
            "sweep=testbed_offpolicy_control_aa` and `rlbench sweep "
            "sweep=testbed_offpolicy_control_lr_div10`, then `rlbench board") in line
    # each sweep's runs are checked against their own sweep: seed 200 is not testbed_offpolicy's
    line = reproduce([run("testbed_offpolicy", 200)], "b")
    assert "not by two commands" in line and "`seed=200`" in line
    # the driver passes each phase its learning rate
    lr = reproduce([run("testbed_offpolicy_control_lr_div10", 0, "trainer.optim.lr=1e-05")],
                   "b", "python benchmarks/offpolicy_testbed.py", "trainer.optim.lr")
    assert lr.endswith("`python benchmarks/offpolicy_testbed.py`, then `b`.")


def _tool_call_reported_cell():
    """sweep=agentic_decide's GRPO cell, validated (which fills what the task decides, such as
    the response length), as the tool-call sweeps are compared with it."""
    reported = compose_config(["sweep=agentic_decide", "algorithm=grpo", "task=agentic_qa",
                               "model=tiny", "seed=0"])
    validate_config(reported, hardware=False)
    return reported


@pytest.mark.slow
def test_tool_call_control_sweeps_make_the_rows_its_board_declares():
    """The tool-call testbed (conf/board/agentic_decide.yaml): an A/A row on seeds of its own and
    an over-searching warm start, each sweep=agentic_decide's GRPO cell otherwise."""
    declared = load_config(CONF_DIR / "board" / "agentic_decide.yaml").plan.controls
    assert declared == {"agentic_decide": {"positive": "grpo@both_hops", "aa": "grpo@aa",
                                           "direction": "above"}}
    reported = _tool_call_reported_cell()
    for role, sweep in (("aa", "agentic_decide_control_aa"),
                        ("positive", "agentic_decide_control_both_hops")):
        cells = expand_cells([f"sweep={sweep}"])
        assert len(cells) == 5
        for cell in (cells[0], cells[-1]):
            cfg = compose_config(cell)
            validate_config(cfg, hardware=False)
            label = f"{cfg.algorithm.name}@{cfg.tracking.tags['rlbench.variant']}"
            assert label == declared["agentic_decide"][role]
            assert cfg.tracking.experiment == reported.tracking.experiment
            assert (cfg.trainer, cfg.model, cfg.rollout, cfg.data) == \
                (reported.trainer, reported.model, reported.rollout, reported.data)
            tiny = dict(cfg.task.tiny)
            assert tiny.pop("warmstart_trace") == ("needed" if role == "aa" else "both_hops")
            assert tiny == {k: v for k, v in reported.task.tiny.items() if k != "warmstart_trace"}
            tags = seed_tags(cfg)
            if role == "aa":
                assert cfg.seed >= 200 and tags["rlbench.seed"] == str(cfg.seed - 200)
            else:
                assert tags["rlbench.seed"] == str(cfg.seed) and cfg.seed < 5


@pytest.mark.slow
def test_tool_call_tuning_is_the_reported_grpo_cell_on_seeds_of_its_own_at_its_grid():
    """sweep=agentic_decide_tuning chooses the testbed's rate: GRPO on seeds 100-101 (neither
    reported nor A/A), at three rates among which the reported rate is, everything else
    sweep=agentic_decide's GRPO cell (warm start included), into an experiment of its own."""
    reported = _tool_call_reported_cell()
    cells = [compose_config(cell) for cell in expand_cells(["sweep=agentic_decide_tuning"])]
    assert len(cells) == 6
    assert {c.seed for c in cells} == {100, 101}
    rates = {c.trainer.optim.lr for c in cells}
    assert rates == {1e-4, 3e-5, 1e-5} and reported.trainer.optim.lr in rates
    for cfg in cells:
        validate_config(cfg, hardware=False)
        assert cfg.algorithm.name == "grpo"
        assert cfg.tracking.experiment != reported.tracking.experiment
        assert (cfg.model, cfg.rollout, cfg.data, cfg.task) == \
            (reported.model, reported.rollout, reported.data, reported.task)
        trainer = dict(cfg.trainer, optim={**cfg.trainer.optim, "lr": reported.trainer.optim.lr})
        assert trainer == dict(reported.trainer)
