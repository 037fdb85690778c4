"""`rlbench ui`: the printed URL opens on the experiment's runs (checked by querying the server
it started), and SIGTERM stops the whole server: no process of it is left."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from harness.tracking import Tracker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(base: str, path: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + "api/2.0/mlflow/" + path, data=data,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


@pytest.mark.slow
def test_ui_lands_on_the_runs_and_sigterm_leaves_no_server_process(tmp_path: Path, cli_env):
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    tracker = Tracker(uri, "rlbench")
    tracker.start("a-run", {"rlbench.kind": "train"})
    tracker.log_metrics({"final/x": 1.0}, step=1)
    tracker.end("FINISHED")

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "ui", "--port", str(port),
                             "--uri", uri], env=cli_env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        url = None
        deadline = time.time() + 540
        for line in proc.stdout:
            found = re.search(r"runs: (http://\S+)", line)
            if found:
                url = found.group(1)
                break
            if time.time() > deadline:
                break
        assert url is not None, "rlbench ui printed no runs URL"
        base, _, fragment = url.partition("#")
        exp_id = re.fullmatch(r"/experiments/(\w+)/runs\?workflowType=machine_learning",
                              fragment).group(1)
        assert exp_id == tracker.experiment_id
        # the landing page is served, and the runs it shows are the experiment's runs
        with urllib.request.urlopen(base, timeout=30) as resp:
            assert resp.status == 200
        runs = api(base, "runs/search", {"experiment_ids": [exp_id]})["runs"]
        assert [r["info"]["run_id"] for r in runs] == [tracker.run_id]
        tags = api(base, f"experiments/get?experiment_id={exp_id}")["experiment"]["tags"]
        assert {"key": "mlflow.experimentKind", "value": "custom_model_development"} in tags

        server = psutil.Process(proc.pid).children(recursive=True)
        assert server, "no server processes under rlbench ui"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        _, alive = psutil.wait_procs(server, timeout=30)
        assert not alive, f"server processes left: {[p.pid for p in alive]}"
        with socket.socket() as s:  # nothing serves the port any more
            assert s.connect_ex(("127.0.0.1", port)) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
