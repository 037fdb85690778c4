"""Provenance of a board (issue 20): a dirty checkout is refused unless told otherwise (and then
the board says so), the two commands that reproduce a board are written on it when its runs came
from one named sweep, the runs behind it are exported and rebuild the same board, and every
committed board names a sweep that exists in conf/sweep/."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from harness.cli.board import exports, load_exports
from harness.report import provenance
from harness.report.board import build_leaderboards as _build
from harness.report.config import BoardError
from harness.report.provenance import Checkout, import_runs, read_export
from harness.tracking import open_client

ROOT = Path(__file__).resolve().parents[2]
build_leaderboards = functools.partial(_build, allow_dirty=True, log_to_mlflow=False)


def _store(tmp_path, sweep_tags, extra=()):
    """Runs (algorithm, seed, sweep) as ``rlbench sweep sweep=<sweep>`` tags them, each launched
    with the overrides of its cell plus ``extra``."""
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    client = open_client(uri)
    exp = client.create_experiment("e", artifact_location=(tmp_path / "a").as_uri())
    for i, (alg, seed, sweep) in enumerate(sweep_tags):
        tags = {"rlbench.algorithm": alg, "rlbench.task": "countdown",
                "rlbench.task_variant": "tiny", "rlbench.model": "tiny", "rlbench.seed": str(seed),
                "rlbench.temperature": "1.0", "rlbench.git_commit": "f" * 40}
        if sweep:
            tags["rlbench.sweep"] = sweep
            tags["rlbench.overrides"] = json.dumps([
                f"algorithm={alg}", "task=countdown", "model=tiny", "trainer=offpolicy",
                f"seed={seed}", f"sweep={sweep}", "backend.threads=1", *extra])
        rid = client.create_run(exp, start_time=1000 + i, tags=tags).info.run_id
        client.log_batch(rid, params=[Param("seed", str(seed)), Param("algorithm.name", alg)],
                         metrics=[Metric("final/heldout/pass_at_1", 0.2 + seed / 100, 0, 2),
                                  Metric("eval/heldout/pass_at_1", 0.1, 0, 0),
                                  Metric("eval/heldout/pass_at_1", 0.2 + seed / 100, 0, 2),
                                  Metric("rollout/tokens_total", 100.0, 0, 1),
                                  Metric("rollout/tokens_total", 200.0, 0, 2)])
        client.set_terminated(rid, "FINISHED")
    return uri


@pytest.mark.slow
def test_dirty_checkout_is_refused_unless_allowed(tmp_path, monkeypatch):
    uri = _store(tmp_path, [("grpo", 0, "s"), ("grpo", 1, "s")])
    monkeypatch.setattr(provenance, "checkout",
                        lambda out: Checkout("a" * 40, ("harness/trainer.py",)))
    with pytest.raises(BoardError, match=r"uncommitted changes \(1 path\(s\): "
                                         r"harness/trainer\.py\).*--allow-dirty"):
        _build(uri, "e", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    _build(uri, "e", tmp_path / "out", allow_dirty=True, log_to_mlflow=False)
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "with uncommitted changes to 1 path(s), built with --allow-dirty" in readme
    md = (tmp_path / "out" / "countdown-tiny" / "tiny" / "leaderboard.md").read_text()
    assert "built with --allow-dirty" in md


def test_checkout_lists_changes_outside_leaderboards_and_the_output(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)

    git("init", "-q")
    for path in ("code.py", "leaderboards/old/README.md"):
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text("x\n")
    git("add", ".")
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "init")
    monkeypatch.setattr(provenance, "REPO", repo)
    assert provenance.checkout(repo / "boards").dirty == ()
    (repo / "leaderboards/old/README.md").write_text("regenerated\n")  # another board: fine
    (repo / "boards").mkdir()
    (repo / "boards" / "new.md").write_text("this board\n")
    assert provenance.checkout(repo / "boards").dirty == ()
    (repo / "code.py").write_text("changed\n")
    (repo / "scratch.py").write_text("untracked\n")
    assert provenance.checkout(repo / "boards").dirty == ("code.py", "scratch.py")


@pytest.mark.slow
def test_reproduce_line_names_the_sweep_and_the_board_command(tmp_path):
    uri = _store(tmp_path, [("grpo", 0, "testbed_offpolicy"), ("grpo", 1, "testbed_offpolicy")])
    build_leaderboards(uri, "e", tmp_path / "out")
    readme = (tmp_path / "out" / "README.md").read_text()
    # at the runs' one commit: at another one the code, and so the numbers, may differ
    assert ("- Reproduce (from the repository root, at the runs' commit `ffffffffffff`): "
            "`rlbench sweep sweep=testbed_offpolicy`, then `rlbench board --experiment e --out "
            "out`.") in readme
    assert f"- Runs made at commit: `{'f' * 12}` (2)." in readme


@pytest.mark.slow
def test_reproduce_line_refuses_runs_with_overrides_the_sweep_does_not_make(tmp_path):
    uri = _store(tmp_path, [("grpo", 0, "testbed_offpolicy"), ("grpo", 1, "testbed_offpolicy")],
                 extra=("trainer.steps=1",))
    build_leaderboards(uri, "e", tmp_path / "out")
    readme = (tmp_path / "out" / "README.md").read_text()
    assert ("- Reproduce: not by two commands: runs of sweep `testbed_offpolicy` had overrides "
            "it does not make: `trainer.steps=1` (2).") in readme


@pytest.mark.slow
def test_reproduce_line_says_when_runs_did_not_come_from_one_sweep(tmp_path):
    uri = _store(tmp_path, [("grpo", 0, "testbed_offpolicy"), ("grpo", 1, "")])
    build_leaderboards(uri, "e", tmp_path / "out")
    readme = (tmp_path / "out" / "README.md").read_text()
    assert ("- Reproduce: not by two commands: runs came from sweep `testbed_offpolicy` (1) and 1 "
            "run(s) not launched by a named sweep.") in readme


@pytest.mark.slow
def test_export_rebuilds_the_same_board(tmp_path):
    uri = _store(tmp_path, [("grpo", 0, "testbed_offpolicy"), ("grpo", 1, "testbed_offpolicy"),
                            ("dapo", 0, "testbed_offpolicy"), ("dapo", 1, "testbed_offpolicy")])
    build_leaderboards(uri, "e", tmp_path / "out")
    d = tmp_path / "out" / "countdown-tiny" / "tiny"
    export = d / "runs.jsonl.gz"
    records = read_export(export)
    assert len(records) == 4
    assert records[0]["metrics"]["rollout/tokens_total"][1][:2] == [2, 200.0]
    assert import_runs(export, f"sqlite:///{tmp_path / 'copy.db'}", "e") == (4, 0)
    build_leaderboards(f"sqlite:///{tmp_path / 'copy.db'}", "e", tmp_path / "again")
    again = tmp_path / "again" / "countdown-tiny" / "tiny"
    assert (again / "leaderboard.csv").read_text() == (d / "leaderboard.csv").read_text()
    assert (again / "runs.jsonl.gz").read_bytes() == export.read_bytes()  # original ids kept


def test_every_committed_board_names_an_existing_sweep():
    sweeps = {p.stem for p in (ROOT / "conf" / "sweep").glob("*.yaml")}
    boards = {p.parent.relative_to(ROOT / "leaderboards").as_posix()
              for p in (ROOT / "leaderboards").glob("**/README.md")
              if "Generated by `rlbench board`" in p.read_text() or p.parent.name == "lantern"}
    assert boards, "no committed boards found"
    for board in sorted(boards):
        readme = (ROOT / "leaderboards" / board / "README.md").read_text()
        # a tuned board is reproduced by its driver script (its board config's reproduce:)
        driver = re.search(r"Reproduce \(from the repository root[^)]*\): `python "
                           r"(benchmarks/\w+\.py) [^`]*`, then `rlbench board [^`]*--out "
                           r"leaderboards/" + re.escape(board), readme)
        if driver:
            assert (ROOT / driver.group(1)).is_file(), board
            assert any((ROOT / "leaderboards" / board).glob("**/runs.jsonl.gz")), board
            continue
        # one sweep, or several joined by "and" (the LANTERN track's targets and its A/A)
        found = re.search(r"Reproduce \(from the repository root[^)]*\): ((?:`rlbench sweep "
                          r"(?:track=\w+ )?sweep=\w+`(?: \([^)]*\))?(?: and )?)+), then "
                          r"`rlbench board [^`]*--out leaderboards/" + re.escape(board), readme)
        assert found, board
        for track, sweep in re.findall(r"`rlbench sweep (?:track=(\w+) )?sweep=(\w+)`",
                                       found.group(1)):
            # a track's sweeps live in conf/<track>/sweep/
            assert sweep in (sweeps if not track else {
                p.stem for p in (ROOT / "conf" / track / "sweep").glob("*.yaml")}), board
        assert any((ROOT / "leaderboards" / board).glob("**/runs.jsonl.gz")), board


def test_demo_writes_only_paths_git_ignores(monkeypatch, tmp_path):
    """``rlbench demo`` in a clone leaves ``git status`` clean: everything goes under its own
    ignored folder, its sweep to the named sweep's own experiment (never the default one)."""
    from harness.cli import compose_config, demo

    calls = []
    monkeypatch.setattr(demo, "_run", lambda args, env: calls.append(args))
    monkeypatch.chdir(ROOT)
    demo.run_demo()
    board = next(c for c in calls if c[0] == "board")
    out = Path(board[board.index("--out") + 1]).relative_to(ROOT)
    experiment = board[board.index("--experiment") + 1]
    assert experiment == compose_config(["sweep=countdown_baselines"]).tracking.experiment
    assert experiment != compose_config([]).tracking.experiment  # smoke runs land elsewhere
    sweep = next(c for c in calls if c[0] == "sweep")
    assert not any(a.startswith("tracking.experiment=") for a in sweep)
    root = out.parent
    written = [f"{out}/README.md", f"{out}/countdown-tiny/tiny/leaderboard.md",
               f"{root}/mlruns.db", f"{root}/mlartifacts/1/x", f"{root}/multirun/2026-01-01/x"]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *written], cwd=ROOT,
                             capture_output=True, text=True).stdout.split()
    assert ignored == written


@pytest.mark.slow
def test_sweep_records_its_overrides_and_the_board_checks_them(tmp_path, cli_env):
    """Through the command line: a named sweep's cell run with an extra override is tagged with
    its overrides, and the board built from it says the sweep alone does not reproduce it."""
    from tests.helpers import FAST_PRETRAIN

    cli = [sys.executable, "-m", "harness.cli"]
    small = [*FAST_PRETRAIN, "backend.threads=1", "data.prompts_per_step=4", "rollout.n=4",
             "task.tiny.eval.heldout.limit=8", "task.tiny.eval.heldout.n=2",
             "task.tiny.eval.heldout.k=[1,2]", "tracking.log_samples=0"]
    out = subprocess.run([*cli, "sweep", "sweep=countdown_baselines", "algorithm=grpo", "seed=0",
                          "trainer.steps=1", *small], cwd=tmp_path, env=cli_env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    client = MlflowClient(cli_env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("countdown_baselines").experiment_id
    (run,) = client.search_runs([exp])
    overrides = json.loads(run.data.tags["rlbench.overrides"])
    assert {"sweep=countdown_baselines", "algorithm=grpo", "seed=0", "trainer.steps=1"} <= \
        set(overrides)
    board = subprocess.run([*cli, "board", "--experiment", "countdown_baselines", "--out",
                            str(tmp_path / "b"), "--allow-dirty", "--no-mlflow"], cwd=tmp_path,
                           env=cli_env, capture_output=True, text=True, timeout=600)
    assert board.returncode == 0, board.stderr[-2000:]
    readme = (tmp_path / "b" / "README.md").read_text()
    line = next(x for x in readme.splitlines() if x.startswith("- Reproduce"))
    assert line.startswith("- Reproduce: not by two commands: runs of sweep "
                           "`countdown_baselines` had overrides it does not make: ")
    assert "`trainer.steps=1` (1)" in line and "`rollout.n=4` (1)" in line
    # the cell's own values and what cannot change a result are not held against it
    assert not any(k in line for k in ("algorithm=", "seed=", "backend.threads", "tracking."))


@pytest.mark.slow
def test_a_board_names_what_its_recipe_cannot_show(tmp_path):
    uri = _store(tmp_path, [("grpo", 0, "testbed_offpolicy"), ("grpo", 1, "testbed_offpolicy")])
    config = tmp_path / "board.yaml"
    config.write_text("limits:\n  testbed_offpolicy: >-\n    One learning rate\n"
                      "    for every row.\n  other_sweep: Never printed here.\n")
    build_leaderboards(uri, "e", tmp_path / "out", config=str(config))
    for page in ("README.md", "countdown-tiny/tiny/leaderboard.md"):
        text = (tmp_path / "out" / page).read_text()
        assert "- What recipe `testbed_offpolicy` cannot show: One learning rate for every row." \
            in text
        assert "Never printed here" not in text


def test_every_limit_names_an_existing_sweep_and_every_committed_board_states_one():
    from harness.report.config import load_config

    sweeps = {p.stem for p in (ROOT / "conf" / "sweep").glob("*.yaml")}
    for path in (ROOT / "conf" / "board").glob("*.yaml"):
        assert set(load_config(path).limits) <= sweeps, path.name
    limits = {k for p in (ROOT / "conf" / "board").glob("*.yaml") for k in load_config(p).limits}
    for readme in (ROOT / "leaderboards").glob("*/README.md"):
        found = re.search(r"`rlbench sweep sweep=(\w+)`", readme.read_text())
        if found:
            assert found.group(1) in limits, f"{readme.parent.name}: no limits for its sweep"
            assert f"- What recipe `{found.group(1)}` cannot show: " in readme.read_text()


def test_a_run_is_dirty_for_changed_code_but_not_for_a_rewritten_board(tmp_path):
    from harness.manifest import git_state

    repo = tmp_path / "repo"
    for path in ("code.py", "leaderboards/b/README.md"):
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text("x\n")
    for args in (["init", "-q"], ["add", "."],
                 ["-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "init"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    assert git_state(repo)["dirty"] is False
    (repo / "leaderboards/b/README.md").write_text("regenerated\n")
    assert git_state(repo)["dirty"] is False
    (repo / "code.py").write_text("changed\n")
    assert git_state(repo)["dirty"] is True


def test_a_swept_number_written_back_in_another_form_still_reproduces():
    from types import SimpleNamespace

    def run(lr: str, seed: int) -> SimpleNamespace:
        return SimpleNamespace(sweep="lpo_lr_tuning", overrides=[
            "algorithm=grpo", f"trainer.optim.lr={lr}", "task=countdown", "model=tiny",
            f"seed={seed}", "sweep=lpo_lr_tuning"])

    line = provenance.reproduce([run("0.0001", 0), run("3e-05", 1)], "rlbench board x")
    assert line.startswith("- Reproduce (from the repository root): `rlbench sweep "
                           "sweep=lpo_lr_tuning`"), line
    line = provenance.reproduce([run("0.0002", 0)], "rlbench board x")
    assert "had overrides it does not make: `trainer.optim.lr=0.0002`" in line


def test_reproduce_names_a_commit_only_when_every_run_shares_one_clean_commit():
    a, b = "a" * 40, "b" * 40
    assert provenance.where([a, a]) == ("from the repository root, at the runs' commit "
                                        "`aaaaaaaaaaaa`")
    for mixed in ([a, b], [a + "+dirty"], [a, ""], []):
        assert provenance.where(mixed) == "from the repository root", mixed


# Every committed board's runs at one clean commit (benchmarks/regenerate_boards.sh regenerates
# them together; then move ONE_COMMIT to the new commit). A board regenerated on its own since is
# listed with its own commit: every run of it must be there, and the list should shrink to none.
ONE_COMMIT = "28e09c2536ef"
REGENERATED = {"testbed-offpolicy": "eb9084f7602c",  # tuned on disjoint seeds, with controls
               "suite": "5d946209dca0",  # the suite: 360 cells over machine runs, one commit
               "lantern": "f46a5940c1a5",  # with its A/A control
               "testbed-entropy": "ea11bd863535",  # entropy against its target, controls
               "testbed-lope-tokens": "47fd6d2ab8a0",  # LOPE vs GRPO at equal tokens
               "testbed-agentic-decide": "eb9084f7602c"}  # tool calls, with controls


@pytest.mark.slow
def test_every_committed_board_has_its_runs_at_one_clean_commit():
    boards = {p.name for p in (ROOT / "leaderboards").iterdir() if p.is_dir()}
    assert len(boards) >= 10 and set(REGENERATED) <= boards
    for board in sorted(boards):
        tags = [r["tags"] for export in (ROOT / "leaderboards" / board).glob("**/runs.jsonl.gz")
                for r in read_export(export)]
        seen = {(t.get("rlbench.git_commit", "")[:12], t.get("rlbench.git_dirty", "").lower())
                for t in tags}
        want = REGENERATED.get(board, ONE_COMMIT)
        assert seen == {(want, "false")}, f"{board}: runs at {sorted(seen)}"


def _assert_same_board(committed: Path, rebuilt: Path) -> None:
    """Every file of ``rebuilt`` equals ``committed``'s, byte for byte (plots, CSVs, exports),
    the pages but for the lines that say where and when a board was built."""
    files = sorted(p.relative_to(committed) for p in committed.glob("**/*") if p.is_file())
    assert files and files == sorted(p.relative_to(rebuilt) for p in rebuilt.glob("**/*")
                                     if p.is_file())
    for name in files:
        if name.suffix == ".md":
            keep = [ln for ln in (committed / name).read_text().splitlines()
                    if not provenance.BUILD_LINES.match(ln)]
            assert keep == [ln for ln in (rebuilt / name).read_text().splitlines()
                            if not provenance.BUILD_LINES.match(ln)], name
        else:
            assert (committed / name).read_bytes() == (rebuilt / name).read_bytes(), name


# code-tiny: rebuilt through `rlbench board --runs` below, in the fast lane; these take 7 to 40 s
@pytest.mark.slow
@pytest.mark.parametrize("board", ["geometry3k-tiny", "countdown-baselines", "lpo-lr-tuned"])
def test_a_committed_board_rebuilds_from_its_export_with_the_current_code(tmp_path, monkeypatch,
                                                                          board):
    # The committed pages must be what today's board code makes of their exported runs: a change
    # to the board that alters a page fails here until the boards are rebuilt.
    committed = ROOT / "leaderboards" / board
    readme = (committed / "README.md").read_text()
    experiment = re.search(r"Experiment: `([^`]*)`", readme).group(1)
    config = re.search(r"then `rlbench board [^`]*--config (\S+?)`", readme)
    uri = f"sqlite:///{tmp_path / 'copy.db'}"
    load_exports([str(committed)], uri, experiment)  # what `rlbench board --runs` loads
    # the page names its --out relative to the repository: leaderboards/<board>
    monkeypatch.setattr("harness.report.board.REPO", tmp_path)
    rebuilt = tmp_path / "leaderboards" / board
    build_leaderboards(uri, experiment, rebuilt,
                       config=ROOT / config.group(1) if config else None)
    _assert_same_board(committed, rebuilt)


def test_build_lines_are_only_where_and_when_a_board_was_built():
    head = (ROOT / "leaderboards" / "code-tiny" / "README.md").read_text().splitlines()
    hidden = [ln.split(":")[0].split(" `")[0] for ln in head if provenance.BUILD_LINES.match(ln)]
    assert hidden == ["- Tracking URI", "- Command", "- Board built at commit", "- Date",
                      "  - made by"]


def test_runs_names_each_export_once_however_it_is_reached(tmp_path):
    for page in ("a/x", "b/y"):
        (tmp_path / page).mkdir(parents=True)
        (tmp_path / page / "runs.jsonl.gz").write_bytes(b"")
    found = exports([str(tmp_path), str(tmp_path / "a" / "x" / "runs.jsonl.gz")])
    assert [p.relative_to(tmp_path).as_posix() for p in found] == ["a/x/runs.jsonl.gz",
                                                                    "b/y/runs.jsonl.gz"]


@pytest.mark.slow
def test_board_runs_rebuilds_a_committed_board_from_its_export_alone(tmp_path,
                                                                    rlbench_in_process):
    out = rlbench_in_process("board", "--experiment", "code-tiny", "--runs",
                             str(ROOT / "leaderboards" / "code-tiny"),
                             "--out", str(tmp_path / "code-tiny"), "--allow-dirty", cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    head = (tmp_path / "code-tiny" / "README.md").read_text().splitlines()
    for page in (tmp_path / "code-tiny").glob("**/*.md"):  # --out outside the repository
        page.write_text(page.read_text().replace("--out code-tiny`",
                                                 "--out leaderboards/code-tiny`"))
    _assert_same_board(ROOT / "leaderboards" / "code-tiny", tmp_path / "code-tiny")
    # the export named relative to the repository, and nothing logged to the deleted store
    assert ("- Tracking URI: none; the exported runs in leaderboards/code-tiny, loaded into a "
            "temporary store") in head
    assert ("- Command: `rlbench board --runs leaderboards/code-tiny --experiment code-tiny "
            "--out code-tiny --no-mlflow`") in head
