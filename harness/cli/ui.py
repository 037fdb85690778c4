"""``rlbench ui``: the MLflow UI on 127.0.0.1, opening on the runs of an experiment.

The server (``mlflow ui``) starts in its own process group; Ctrl-C, SIGTERM or SIGHUP to
``rlbench ui`` stops that whole group (SIGTERM, then SIGKILL after a grace period), so no server
worker is left serving the port. MLflow 3's UI opens on the GenAI (traces) view unless the URL
or the experiment says otherwise: the printed URL names the experiment's runs page in the
machine-learning view, and rlbench's experiments are tagged as model-development ones
(:mod:`harness.tracking`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any

log = logging.getLogger("rlbench")
GRACE_S = 10.0


def landing_url(host: str, port: int, experiment_id: str | None) -> str:
    base = f"http://{host}:{port}/"
    if experiment_id is None:
        return base + "#/experiments?workflowType=machine_learning"
    return base + f"#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def _experiment_id(uri: str, name: str) -> str | None:
    """The id of experiment ``name``, else of the most recently active experiment with runs."""
    from mlflow.tracking import MlflowClient

    from harness.claims import is_claim_experiment

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    experiments = [e for e in client.search_experiments() if e.name != "Default"
                   and not is_claim_experiment(e.name)]
    return experiments[0].experiment_id if experiments else None


def _ready(url: str, proc: subprocess.Popen, timeout_s: float = 600.0) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError), urllib.request.urlopen(url + "health",
                                                                   timeout=2) as resp:
            if resp.status == 200:
                return True
        time.sleep(0.5)
    return False


def stop_group(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """SIGTERM to the server's whole process group, SIGKILL to whatever outlives the grace."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.time() + grace_s
    while time.time() < deadline:
        with contextlib.suppress(ChildProcessError):
            proc.poll()
        try:
            os.killpg(proc.pid, 0)  # anyone left in the group?
        except ProcessLookupError:
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(timeout=5)


def cmd_ui(args: argparse.Namespace) -> None:
    from harness.tracking import resolve_tracking_uri

    uri = resolve_tracking_uri(args.uri)
    host = "127.0.0.1"
    # one worker: a local UI needs no more, and it starts in a fraction of the time of four
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
           "--host", host, "--port", str(args.port), "--workers", "1"]
    print(f"starting the MLflow UI for {uri} on http://{host}:{args.port}/ ...", flush=True)
    proc = subprocess.Popen(cmd, start_new_session=True)
    received: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        received.append(signum)
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        if not _ready(f"http://{host}:{args.port}/", proc):
            code = proc.poll()
            raise SystemExit(f"rlbench: error: the MLflow server did not start on port "
                             f"{args.port} (exit {code}); is the port in use? try --port 5001")
        url = landing_url(host, args.port, _experiment_id(uri, args.experiment))
        print(f"MLflow UI ready\n  runs: {url}\n  (Ctrl-C to stop)", flush=True)
        raise SystemExit(proc.wait())
    except KeyboardInterrupt:
        stop_group(proc)
        raise SystemExit(128 + (received[0] if received else signal.SIGINT)) from None
    finally:
        if proc.poll() is None:
            stop_group(proc)
