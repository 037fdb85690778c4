"""``rlbench demo``: the embedded default main job, end to end on a laptop CPU.

1. warm-start the tiny model on tiny Countdown (cached; skipped when already built);
2. sweep the baseline algorithms over three seeds with the default tiny recipe
   (``sweep=countdown_baselines``, into its own MLflow experiment), as one Hydra multirun on the
   joblib launcher (one job per core, one torch thread per job); cells that already FINISHED are
   skipped, so a second demo only rebuilds the leaderboard;
3. build the leaderboard from the MLflow runs into ``outputs/leaderboards`` and say where it is.

Everything it writes is ignored by git (``mlruns.db``, ``mlartifacts/``, ``multirun/``,
``outputs/``, the model cache), so a clone stays clean. Every step is an ordinary ``rlbench``
command, printed before it runs; the committed ``leaderboards/countdown-baselines`` is the same
sweep with ``--out leaderboards/countdown-baselines`` (the two commands are written on it).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time

from harness.tracking import resolve_tracking_uri

SWEEP = "countdown_baselines"
OUT = "outputs/leaderboards"  # ignored by git, unlike leaderboards/


def _run(args: list[str]) -> None:
    cmd = [sys.executable, "-m", "harness.cli", *args]
    print("\n$ rlbench " + " ".join(shlex.quote(a) for a in args), flush=True)
    code = subprocess.call(cmd)
    if code != 0:
        raise SystemExit(code)


def run_demo() -> None:
    start = time.perf_counter()
    from harness.cli import compose_config

    jobs = max(1, min(os.cpu_count() or 1, 18))  # 18 cells in sweep=countdown_baselines
    experiment = compose_config([f"sweep={SWEEP}"]).tracking.experiment
    _run(["pretrain", "model=tiny", "task=countdown"])
    uri = resolve_tracking_uri(None)
    _run([
        "sweep",
        f"sweep={SWEEP}",
        "hydra/launcher=joblib",
        f"hydra.launcher.n_jobs={jobs}",
        "trainer.status_every=50",
    ])
    # a local demo may run from a modified checkout; the board then says so
    _run(["board", "--experiment", experiment, "--out", OUT, "--allow-dirty"])
    minutes = (time.perf_counter() - start) / 60
    print(
        f"\nDone in {minutes:.1f} min.\n"
        f"  leaderboard:   {OUT}/README.md (and {OUT}/countdown-tiny/tiny/)\n"
        f"  MLflow runs:   {uri}  (experiment {experiment!r})\n"
        f"  browse them:   rlbench ui   then open http://127.0.0.1:5000",
        flush=True,
    )
