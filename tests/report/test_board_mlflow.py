"""A leaderboard browsable in MLflow, read back from a real ``mlflow server`` over its REST API.

The server runs on 127.0.0.1 on a free port with a SQLite backend and a proxied artifact store in
the test's temporary directory; the test logs a few synthetic training runs over HTTP, builds the
leaderboard twice from the server, and reads the leaderboard run, its tags and its artifacts back
with plain HTTP requests (``runs/search``, ``artifacts/list``, ``mlflow-artifacts``).
"""

import contextlib
import csv
import functools
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from harness.report.board import build_leaderboards as _build

# built from whatever checkout runs the tests; the dirty-tree refusal has its own test
build_leaderboards = functools.partial(_build, allow_dirty=True)

pytestmark = pytest.mark.slow

SEEDS = (0, 1, 2)
LEVEL = {"grpo": 0.2, "dr_grpo": 0.3}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(base: str, path: str, **query) -> bytes:
    url = f"{base}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.read()


def _post(base: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"{base}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


@pytest.fixture
def server(tmp_path):
    root = tmp_path
    port = _free_port()
    log = open(root / "server.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
         "--artifacts-destination", str(root / "artifacts")],
        stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            with contextlib.suppress(OSError):
                if _get(base, "/health").strip() == b"OK":
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail("mlflow server did not come up:\n"
                            + (root / "server.log").read_text(errors="replace")[-3000:])
            time.sleep(0.5)
        yield {"base": base, "root": root}
    finally:
        # the server's own process group (uvicorn worker, job runner): started here, ended here
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()


@pytest.fixture
def built(server):
    client = MlflowClient(server["base"])
    exp = client.create_experiment("rlbench")
    runs = {}
    for alg, level in LEVEL.items():
        for seed in SEEDS:
            tags = {"rlbench.algorithm": alg, "rlbench.task": "countdown",
                    "rlbench.task_variant": "tiny", "rlbench.model": "tiny",
                    "rlbench.seed": str(seed), "rlbench.temperature": "1.0",
                    "rlbench.kind": "train"}
            rid = client.create_run(exp, tags=tags).info.run_id
            final = level + 0.01 * seed
            metrics = [Metric("eval/heldout/pass_at_1", v, 0, s)
                       for s, v in ((0, 0.1), (10, final - 0.01), (20, final))]
            metrics += [Metric("rollout/reward_mean", level * s / 20, 0, s) for s in range(21)]
            metrics += [Metric("final/heldout/pass_at_1", final, 0, 20),
                        Metric("final/tokens_total", 1000.0 + seed, 0, 20),
                        Metric("final/wall_s", 5.0, 0, 20)]
            client.log_batch(rid, metrics=metrics)
            client.set_terminated(rid, "FINISHED")
            runs[alg, seed] = rid
    out = server["root"] / "leaderboards"
    build_leaderboards(server["base"], "rlbench", out)
    first = _search_leaderboards(server["base"], exp)
    build_leaderboards(server["base"], "rlbench", out)  # a rebuild replaces the run
    return {"exp": exp, "runs": runs, "out": out, "first": first}


def _search_leaderboards(base: str, exp: str, view: str = "ACTIVE_ONLY") -> list[dict]:
    found = _post(base, "/api/2.0/mlflow/runs/search", {
        "experiment_ids": [exp], "filter": "tags.`rlbench.kind` = 'leaderboard'",
        "run_view_type": view, "max_results": 100})
    return found.get("runs", [])


def _tags(run: dict) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


def _check_replaced_on_rebuild(server, built):
    (run,) = _search_leaderboards(server["base"], built["exp"])
    (first,) = built["first"]
    assert run["info"]["run_id"] != first["info"]["run_id"]
    assert run["info"]["status"] == "FINISHED"
    deleted = _search_leaderboards(server["base"], built["exp"], "DELETED_ONLY")
    assert [r["info"]["run_id"] for r in deleted] == [first["info"]["run_id"]]
    # the training runs are untouched and the leaderboard run is not one of them
    train = _post(server["base"], "/api/2.0/mlflow/runs/search", {
        "experiment_ids": [built["exp"]], "filter": "tags.`rlbench.kind` = 'train'",
        "max_results": 100})["runs"]
    assert sorted(r["info"]["run_id"] for r in train) == sorted(built["runs"].values())


def _check_row_run_ids_in_tags(server, built):
    (run,) = _search_leaderboards(server["base"], built["exp"])
    tags = _tags(run)
    assert (tags["rlbench.task"], tags["rlbench.model"]) == ("countdown", "tiny")
    for alg in LEVEL:
        assert tags[f"rlbench.leaderboard.runs.{alg}"] == ",".join(
            f"{s}:{built['runs'][alg, s]}" for s in SEEDS)
    assert "dr_grpo" in tags["mlflow.note.content"]  # the run page shows the table
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    assert params["baseline"] == "grpo" and params["experiment"] == "rlbench"


def _check_artifacts(server, built):
    (run,) = _search_leaderboards(server["base"], built["exp"])
    rid = run["info"]["run_id"]
    listed = json.loads(_get(server["base"], "/api/2.0/mlflow/artifacts/list", run_id=rid))
    names = {f["path"] for f in listed["files"]}
    assert {"leaderboard.md", "leaderboard.csv", "leaderboard_table.json", "runs.json",
            "heldout-pass_at_1.png", "reward.png"} <= names
    prefix = run["info"]["artifact_uri"].removeprefix("mlflow-artifacts:/").strip("/")

    def fetch(name: str) -> bytes:
        return _get(server["base"], f"/api/2.0/mlflow-artifacts/artifacts/{prefix}/{name}")

    local = built["out"] / "countdown-tiny" / "tiny"
    assert fetch("leaderboard.csv") == (local / "leaderboard.csv").read_bytes()
    assert fetch("leaderboard.md") == (local / "leaderboard.md").read_bytes()
    assert fetch("heldout-pass_at_1.png")[:8] == PNG_MAGIC
    rows = list(csv.DictReader(io.StringIO(fetch("leaderboard.csv").decode())))
    assert [r["row"] for r in rows] == ["dr_grpo", "grpo"]
    split = json.loads(fetch("leaderboard_table.json"))  # the MLflow table ("split" layout)
    table = [dict(zip(split["columns"], v)) for v in split["data"]]
    assert [t["row"] for t in table] == ["dr_grpo", "grpo"]
    assert table[0]["heldout/pass_at_1/final_mean"] == pytest.approx(0.31, abs=1e-6)
    assert table[0]["heldout/pass_at_1/vs_baseline_mean"] == pytest.approx(0.1, abs=1e-6)
    assert table[0]["heldout/pass_at_1/vs_baseline_pairs"] == 3
    assert {"path": "leaderboard_table.json", "type": "table"} in \
        json.loads(_tags(run)["mlflow.loggedArtifacts"])
    behind = json.loads(fetch("runs.json"))
    assert behind["grpo"] == [{"seed": str(s), "run_id": built["runs"]["grpo", s]}
                              for s in SEEDS]


def test_leaderboard_read_back_through_the_rest_api(server, built):
    """One test (one server start, even under xdist): the rebuild replaced the leaderboard run,
    its tags list the runs behind each row, and its artifacts match the files written."""
    _check_replaced_on_rebuild(server, built)
    _check_row_run_ids_in_tags(server, built)
    _check_artifacts(server, built)
