"""Cell claims (harness/claims.py): one live holder per cell, released at the end of its run,
taken over when its process is gone (same host: pid and start time; another host: heartbeat)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import claims
from harness.claims import TAG, Claim, claim_cell, holder_alive, identity
from harness.tracking import Tracker, open_client

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(tmp_path: Path) -> Tracker:
    return Tracker(f"sqlite:///{tmp_path / 'mlruns.db'}", "claims")


def _plant(store: Tracker, digest: str, generation: int, **tags: str) -> str:
    """A claim made by someone else (its holder tags given)."""
    holder = {**identity(), **{f"{TAG}{k}": v for k, v in tags.items()}}
    return store.client.create_experiment(
        claims.claim_name(store.experiment_id, digest, generation), tags=holder)


def _dead_pid() -> tuple[str, str]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    start = claims.pid_start(proc.pid)
    proc.wait()
    return str(proc.pid), start or ""


def test_a_live_holder_makes_the_cell_busy_and_its_release_frees_it(store):
    first = claim_cell(store.client, store.experiment_id, "c0ffee")
    assert isinstance(first, Claim) and first.name.endswith("/c0ffee/0")
    busy = claim_cell(store.client, store.experiment_id, "c0ffee")
    assert isinstance(busy, str) and f"pid {identity()[f'{TAG}pid']}" in busy
    # another cell is not affected
    assert isinstance(claim_cell(store.client, store.experiment_id, "beef"), Claim)
    first.release()
    first.release()  # idempotent
    second = claim_cell(store.client, store.experiment_id, "c0ffee")
    assert isinstance(second, Claim) and second.name.endswith("/c0ffee/1")


def test_a_claim_whose_process_is_gone_is_taken_over(store):
    pid, start = _dead_pid()
    _plant(store, "dead", 0, pid=pid, pid_start=start)
    taken = claim_cell(store.client, store.experiment_id, "dead")
    assert isinstance(taken, Claim) and taken.name.endswith("/dead/1")


def test_a_reused_pid_is_not_mistaken_for_the_holder():
    me = identity()
    assert holder_alive(me)
    assert not holder_alive({**me, f"{TAG}pid_start": str(int(me[f"{TAG}pid_start"]) + 1)})
    pid, start = _dead_pid()
    assert not holder_alive({**me, f"{TAG}pid": pid, f"{TAG}pid_start": start})


def test_another_hosts_claim_lives_while_its_heartbeat_is_fresh(store):
    now = time.time()
    elsewhere = {**identity(), f"{TAG}host": "node-17", f"{TAG}pid": "1"}
    assert holder_alive({**elsewhere, f"{TAG}heartbeat": f"{now - 10}"}, now)
    assert not holder_alive({**elsewhere, f"{TAG}heartbeat": f"{now - claims.STALE_AFTER_S - 1}"},
                            now)
    _plant(store, "far", 0, host="node-17", pid="1", heartbeat=f"{now - 10}")
    assert isinstance(claim_cell(store.client, store.experiment_id, "far"), str)
    _plant(store, "lost", 0, host="node-17", pid="1",
           heartbeat=f"{now - claims.STALE_AFTER_S - 5}")
    assert isinstance(claim_cell(store.client, store.experiment_id, "lost"), Claim)


def test_the_heartbeat_thread_refreshes_the_claim(store):
    held = claim_cell(store.client, store.experiment_id, "beat")
    before = float(store.client.get_experiment(held.experiment_id).tags[f"{TAG}heartbeat"])
    held.start_heartbeat(store.uri, every_s=0.05)
    deadline = time.time() + 20
    while time.time() < deadline:
        tags = store.client.get_experiment(held.experiment_id).tags
        if float(tags[f"{TAG}heartbeat"]) > before:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the heartbeat tag was never refreshed")
    held.release()
    assert store.client.get_experiment(held.experiment_id).lifecycle_stage == "deleted"


RACE = """
import os, sys, time
from harness.tracking import Tracker
from harness.claims import Claim, claim_cell
t = Tracker(sys.argv[1], "race")
held = claim_cell(t.client, t.experiment_id, "cell")
print("WON" if isinstance(held, Claim) else "BUSY", flush=True)
deadline = time.time() + 300  # every holder lives until all have answered
while not os.path.exists(sys.argv[2]) and time.time() < deadline:
    time.sleep(0.05)
"""


@pytest.mark.slow
def test_processes_racing_for_a_cell_on_a_new_store_leave_one_winner(tmp_path):
    """Six processes open a store that does not exist yet and claim one cell at once: the store
    comes up once (no 'table ... already exists') and exactly one of them gets the cell."""
    uri = f"sqlite:///{tmp_path / 'new' / 'mlruns.db'}"
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = tmp_path / "all-answered"
    procs = [subprocess.Popen([sys.executable, "-c", RACE, uri, str(done)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(6)]
    answers = [p.stdout.readline().strip() for p in procs]
    done.touch()
    results = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, [err[-2000:] for _, err in results]
    assert sorted(answers) == ["BUSY"] * 5 + ["WON"]
    assert not any("Traceback" in err for _, err in results)


@pytest.mark.slow
def test_the_ledger_adds_up_the_processes_of_one_run_and_restarts_for_another(tmp_path):
    path = tmp_path / "logged.json"
    t = Tracker(f"sqlite:///{tmp_path / 'mlruns.db'}", "ledger")
    t.start("r", {"rlbench.seed": "0"})
    t.log_metrics({"a": 1.0, "b": 2.0}, 1)
    t.log_metrics({"a": 3.0}, 2)
    t.end("KILLED", path)
    first = json.loads(path.read_text())
    assert first["metrics"] == {"a": 2, "b": 1} and first["tags"]["rlbench.seed"] == "0"
    again = Tracker(t.uri, "ledger")  # the resumed process
    again.start("r", {}, run_id=t.run_id)
    again.log_metrics({"a": 4.0}, 3)
    again.end("FINISHED", path)
    assert json.loads(path.read_text())["metrics"] == {"a": 3, "b": 1}
    other = Tracker(t.uri, "ledger")
    other.start("s", {})
    other.log_metrics({"c": 1.0}, 1)
    other.end("FINISHED", path)
    assert json.loads(path.read_text())["metrics"] == {"c": 1}
    store = open_client(t.uri)
    assert len(store.get_metric_history(t.run_id, "a")) == 3


def test_rlbench_ui_never_opens_on_a_live_claim(store):
    from harness.cli.ui import _experiment_id

    held = claim_cell(store.client, store.experiment_id, "ui")
    assert isinstance(held, Claim)
    # the newest active experiment is the claim; the fallback passes over it
    assert _experiment_id(store.uri, "no-such-experiment") == store.experiment_id
    held.release()


def test_plan_cell_finds_a_claimed_cell_busy_and_a_finished_one_skipped(tmp_path, model_cache):
    from harness.cell_plan import plan_cell
    from tests.helpers import make_config

    cfg = make_config(tmp_path, model_cache)
    tracker = Tracker(cfg.tracking.uri, cfg.tracking.experiment)
    first = plan_cell(cfg, tracker.client, tracker.experiment_id, tracker.uri)
    assert first.action == "fresh" and first.claim is not None
    second = plan_cell(cfg, tracker.client, tracker.experiment_id, tracker.uri)
    assert second.action == "busy" and second.claim is None
    assert f"cell {first.config_hash} is claimed by pid" in second.reason
    tracker.start("r", {"rlbench.config_hash": first.config_hash})
    tracker.end("FINISHED")
    first.release()
    third = plan_cell(cfg, tracker.client, tracker.experiment_id, tracker.uri)
    assert third.action == "skip" and third.claim is None
    # the skip released its claim: a later plan is not told the cell is busy
    assert plan_cell(cfg, tracker.client, tracker.experiment_id, tracker.uri).action == "skip"


def test_a_claim_created_but_answered_with_an_error_is_adopted_not_left_orphaned(store):
    """MLflow's HTTP client retries a POST whose answer was lost: the retry finds the experiment
    it made itself ('already exists'). The claim carries a nonce, so it is recognised as own."""

    class RetriedCreate:
        def __init__(self, client):
            self.client = client

        def __getattr__(self, name):
            return getattr(self.client, name)

        def create_experiment(self, name, tags=None):
            self.client.create_experiment(name, tags=tags)
            raise RuntimeError(f"RESOURCE_ALREADY_EXISTS: Experiment '{name}' already exists.")

    held = claim_cell(RetriedCreate(store.client), store.experiment_id, "retry")
    assert isinstance(held, Claim) and held.name.endswith("/retry/0")
    held.release()
    assert store.client.get_experiment(held.experiment_id).lifecycle_stage == "deleted"


def test_a_heartbeat_that_finds_its_claim_taken_over_marks_it_lost(store):
    from harness.cell_plan import CellPlan

    held = claim_cell(store.client, store.experiment_id, "taken")
    plan = CellPlan("fresh", "taken", claim=held)
    assert not plan.lost()
    held.start_heartbeat(store.uri, every_s=0.05)
    _plant(store, "taken", 1, host="node-3", pid="1")  # another process presumed this one gone
    assert held.lost.wait(20) and plan.lost()
    held.release()


def test_a_heartbeat_that_is_not_a_finite_recent_time_is_no_live_holder():
    now = time.time()
    elsewhere = {**identity(), f"{TAG}host": "node-17", f"{TAG}pid": "1"}
    for beat in ("inf", "nan", "-inf", f"{now + claims.STALE_AFTER_S + 60}"):
        assert not holder_alive({**elsewhere, f"{TAG}heartbeat": beat}, now), beat


def test_plan_cell_releases_its_claim_when_planning_fails(tmp_path, model_cache, monkeypatch):
    from harness import cell_plan
    from tests.helpers import make_config

    cfg = make_config(tmp_path, model_cache)
    tracker = Tracker(cfg.tracking.uri, cfg.tracking.experiment)

    def broken(*args):
        raise OSError("the store went away")

    monkeypatch.setattr(cell_plan, "_plan", broken)
    with pytest.raises(OSError):
        cell_plan.plan_cell(cfg, tracker.client, tracker.experiment_id, tracker.uri)
    monkeypatch.undo()
    plan = cell_plan.plan_cell(cfg, tracker.client, tracker.experiment_id, tracker.uri)
    assert plan.action == "fresh"  # not "busy": the failed plan gave the cell up
    plan.release()


@pytest.mark.slow
def test_a_run_that_fails_even_at_its_end_gives_its_cell_up(tmp_path, tiny_model_path,
                                                           model_cache, monkeypatch):
    """Setup refuses the data (prompt limit), then recording the end fails too (a full disk):
    the cell's claim is released all the same, so the next launch is not told it is busy."""
    from harness.cell_plan import plan_cell
    from harness.trainer import Trainer
    from harness.typed_config import ConfigError
    from tests.helpers import make_config

    cfg = make_config(tmp_path, model_cache, "data.max_prompt_length=100000")

    def full_disk(self, status, ledger=None):
        raise OSError("No space left on device")

    monkeypatch.setattr(Tracker, "end", full_disk)
    with pytest.raises((ConfigError, OSError)):
        Trainer(cfg).fit()
    monkeypatch.undo()
    tracker = Tracker(cfg.tracking.uri, cfg.tracking.experiment)
    plan = plan_cell(cfg, tracker.client, tracker.experiment_id, tracker.uri)
    assert plan.action == "fresh"
    plan.release()
