"""Cell claims: at most one process trains a cell at a time, whatever launched it and wherever.

The cells of a sweep run under joblib, submitit or Ray, across machines, and a user may rerun a
command while the first still runs. Looking the cell's config hash up before training
(:mod:`harness.cell_plan`) is not enough: two processes that look at the same moment both find
nothing and both train. So a cell is *claimed in the store* before it trains, with the one
atomic operation every MLflow store offers, local database or tracking server alike: creating an
experiment whose name is taken fails (the name is a unique key). The claim of generation ``g`` of
cell ``h`` in experiment ``e`` is the experiment named::

    rlbench.claim/<e>/<h>/<g>

created with its holder's identity as tags (host, boot id and pid namespace, pid and the pid's
start time; a heartbeat time that a daemon thread refreshes every :data:`HEARTBEAT_S` seconds).
A process wanting the cell reads the highest generation:

* none, or its holder released it (the experiment is deleted: done at the end of every run,
  FINISHED, FAILED or KILLED), or its holder is gone -> it creates generation ``g + 1``; if that
  create fails, another process got there first and it reads again;
* its holder is alive -> the cell is busy: the process does not train it (exit 0, one line naming
  the holder).

"Gone": on the same host (same boot id), the holder's pid no longer runs the process that made
the claim (its start time differs, so a reused pid is not mistaken for it); on another host, its
heartbeat is older than :data:`STALE_AFTER_S` (a SIGKILLed job, a lost node). A stale claim is
taken over by creating the next generation, which again only one process can do; the old holder,
if it was alive after all (cut off from the store, its clock wrong), sees the newer generation at
its next heartbeat and stops its run (``Claim.lost``). A claim's create that committed but
answered an error (an HTTP client's retry) is recognised as its own by a nonce tag. A ``file:``
store has no atomic create: claims there are best effort (warned). Released claims
stay as deleted experiments (hidden in the MLflow UI; ``mlflow gc`` may purge them); a live one
is visible in the UI's experiment list while its cell trains.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from harness.tracking import with_retries  # a locked SQLite file is waited for, not failed on

log = logging.getLogger("rlbench")

PREFIX = "rlbench.claim"
HEARTBEAT_S = 30.0
STALE_AFTER_S = 300.0
TAG = "rlbench.claim."  # holder tags: host, boot, pid, pid_start, heartbeat, nonce, run_id


def is_claim_experiment(name: str) -> bool:
    """An experiment that holds a live cell's claim, not runs a user made (hidden from lists)."""
    return name.startswith(f"{PREFIX}/")


def _boot_id() -> str:
    """This machine's boot, and the pid namespace (two containers on one host see other pids)."""
    boot, ns = "", ""
    with contextlib.suppress(OSError):
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    with contextlib.suppress(OSError):
        ns = os.readlink("/proc/self/ns/pid")
    return f"{boot} {ns}".strip()


def pid_start(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, /proc/<pid>/stat field 22), or None
    when no such process runs. Elsewhere than Linux: "alive" when the pid exists."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "?"
    return stat.rsplit(")", 1)[1].split()[19]  # fields after the command name; 22nd overall


def identity() -> dict[str, str]:
    """This process as a claim holder."""
    pid = os.getpid()
    return {f"{TAG}host": socket.gethostname(), f"{TAG}boot": _boot_id(), f"{TAG}pid": str(pid),
            f"{TAG}pid_start": pid_start(pid) or "", f"{TAG}heartbeat": f"{time.time():.3f}"}


def holder_alive(tags: dict[str, str], now: float | None = None) -> bool:
    """Is the process that holds a claim with ``tags`` still running (see the module doc)?"""
    me = identity()
    if (tags.get(f"{TAG}host"), tags.get(f"{TAG}boot")) == (me[f"{TAG}host"], me[f"{TAG}boot"]):
        try:
            pid = int(tags.get(f"{TAG}pid", ""))
        except ValueError:
            return False
        start = pid_start(pid)
        return start is not None and start in (tags.get(f"{TAG}pid_start"), "?")
    try:
        beat = float(tags.get(f"{TAG}heartbeat", "0"))
    except ValueError:
        return False
    age = (time.time() if now is None else now) - beat
    # a beat from the future beyond the window is a clock gone wrong, not a live holder
    return math.isfinite(age) and -STALE_AFTER_S < age < STALE_AFTER_S


def holder_text(tags: dict[str, str]) -> str:
    run = tags.get(f"{TAG}run_id")
    return (f"pid {tags.get(f'{TAG}pid', '?')} on {tags.get(f'{TAG}host', '?')}"
            + (f" (run {run})" if run else ""))


def claim_name(experiment_id: str, digest: str, generation: int) -> str:
    return f"{PREFIX}/{experiment_id}/{digest}/{generation}"


@dataclass
class Claim:
    """A held claim: refreshed by a heartbeat thread until :meth:`release`. ``lost`` is set when
    the heartbeat finds that another process took the cell over (this one was presumed gone):
    the trainer then stops rather than train the cell twice."""

    client: Any
    experiment_id: str  # the claim's own experiment
    name: str
    lost: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start_heartbeat(self, tracking_uri: str, every_s: float = HEARTBEAT_S) -> None:
        experiment_id, digest, generation = self.name[len(PREFIX) + 1:].split("/")

        def beat() -> None:
            from mlflow.tracking import MlflowClient

            client = MlflowClient(tracking_uri=tracking_uri)  # its own, for thread safety
            while not self._stop.wait(every_s):
                try:
                    client.set_experiment_tag(self.experiment_id, f"{TAG}heartbeat",
                                              f"{time.time():.3f}")
                    if max(_generations(client, experiment_id, digest)) > int(generation):
                        log.error("claim %s was taken over by another process: stopping",
                                  self.name)
                        self.lost.set()
                        return
                except Exception as exc:  # a store hiccup must not stop training
                    log.warning("claim %s: heartbeat not recorded (%s)", self.name, exc)

        self._thread = threading.Thread(target=beat, name="rlbench-claim", daemon=True)
        self._thread.start()

    def note_run(self, run_id: str) -> None:
        """Record the run training under this claim (shown to whoever finds the cell busy)."""
        with contextlib.suppress(Exception):
            self.client.set_experiment_tag(self.experiment_id, f"{TAG}run_id", run_id)

    def release(self) -> None:
        """Give the cell up (idempotent): the claim's experiment is deleted."""
        if self._stop.is_set():
            return
        self._stop.set()
        try:
            with_retries(self.client.delete_experiment, self.experiment_id)
        except Exception as exc:  # left behind, it is stale once this process has exited
            log.warning("claim %s not released (%s); it lapses when this process exits",
                        self.name, exc)


def _generations(client: Any, experiment_id: str, digest: str) -> dict[int, Any]:
    from mlflow.entities import ViewType

    prefix = claim_name(experiment_id, digest, 0)[:-1]
    found = client.search_experiments(view_type=ViewType.ALL, max_results=1000,
                                      filter_string=f"name LIKE '{prefix}%'")
    out = {}
    for exp in found:
        tail = exp.name[len(prefix):]
        if exp.name.startswith(prefix) and tail.isdigit():
            out[int(tail)] = exp
    return out


def claim_cell(client: Any, experiment_id: str, digest: str,
               tracking_uri: str | None = None) -> Claim | str:
    """Claim cell ``digest`` of experiment ``experiment_id``: a :class:`Claim`, or (the cell is
    busy) the text naming the live process that holds it."""
    if urlparse(str(client.tracking_uri)).scheme in ("", "file"):
        log.warning("cell claims on a file store (%s) are not atomic: two launches of one cell "
                    "at once may both train it; use an SQLite file or a tracking server",
                    client.tracking_uri)
    for attempt in range(20):
        found = with_retries(_generations, client, experiment_id, digest)
        top = max(found, default=-1)
        if top >= 0:
            exp = found[top]
            if exp.lifecycle_stage == "active" and holder_alive(exp.tags):
                return holder_text(exp.tags)
        name = claim_name(experiment_id, digest, top + 1)
        me = {**identity(), f"{TAG}nonce": uuid.uuid4().hex}
        try:
            claim_id = client.create_experiment(name, tags=me)
        except Exception as exc:  # taken a moment ago by another process: read again
            if not any(s in str(exc).lower() for s in ("exist", "locked")):
                raise
            # a create that committed but answered an error (an HTTP retry) is this one's own
            mine = with_retries(_generations, client, experiment_id, digest).get(top + 1)
            if mine is not None and mine.tags.get(f"{TAG}nonce") == me[f"{TAG}nonce"]:
                claim_id = mine.experiment_id
            else:
                time.sleep(0.05 * (attempt + 1))
                continue
        claim = Claim(client, claim_id, name)
        if tracking_uri is not None:
            claim.start_heartbeat(tracking_uri)
        return claim
    raise RuntimeError(f"could not claim cell {digest} in experiment {experiment_id}: the claim "
                       "changed hands 20 times while reading it")
