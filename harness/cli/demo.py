"""``rlbench demo``: the embedded default main job, end to end on a laptop CPU.

1. warm-start the tiny model on tiny Countdown (cached; skipped when already built);
2. sweep the baseline algorithms over three seeds with the default tiny recipe
   (``sweep=countdown_baselines``), as one Hydra multirun on the joblib launcher (one job per
   core, one torch thread per job); cells that already FINISHED are skipped, so a second demo
   only rebuilds the leaderboard;
3. build the leaderboards from the MLflow runs and say where they are.

Every step is an ordinary ``rlbench`` command, printed before it runs, so the demo is also the
recipe for reproducing the committed leaderboard.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time

from harness.tracking import resolve_tracking_uri

EXPERIMENT = "rlbench"


def _run(args: list[str]) -> None:
    cmd = [sys.executable, "-m", "harness.cli", *args]
    print("\n$ rlbench " + " ".join(shlex.quote(a) for a in args), flush=True)
    code = subprocess.call(cmd)
    if code != 0:
        raise SystemExit(code)


def run_demo() -> None:
    start = time.perf_counter()
    jobs = max(1, min(os.cpu_count() or 1, 18))  # 18 cells in sweep=countdown_baselines
    _run(["pretrain", "model=tiny", "task=countdown"])
    uri = resolve_tracking_uri(None)
    _run([
        "sweep",
        "sweep=countdown_baselines",
        f"tracking.experiment={EXPERIMENT}",
        "hydra/launcher=joblib",
        f"hydra.launcher.n_jobs={jobs}",
        "trainer.status_every=50",
    ])
    _run(["board", "--experiment", EXPERIMENT, "--out", "leaderboards"])
    minutes = (time.perf_counter() - start) / 60
    print(
        f"\nDone in {minutes:.1f} min.\n"
        f"  leaderboards:  leaderboards/README.md (and leaderboards/countdown-tiny/tiny/)\n"
        f"  MLflow runs:   {uri}  (experiment {EXPERIMENT!r})\n"
        f"  browse them:   rlbench ui   then open http://127.0.0.1:5000",
        flush=True,
    )
