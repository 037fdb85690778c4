"""rlbench demo: the embedded default main job, end to end on a laptop CPU.

1. warm-start the tiny model on tiny Countdown (cached in ~/.cache/rlbench; skipped when built);
2. sweep the baseline algorithms over three seeds with the default tiny recipe
   (``sweep=countdown_baselines``), as one Hydra multirun on the joblib launcher (one job per
   core, one torch thread per job); cells that already FINISHED are skipped, so a second demo
   only rebuilds the leaderboard;
3. build the leaderboards from the MLflow runs and say where everything is.

Everything the demo writes goes under one directory, ``./rlbench-demo`` unless ``--dir`` says
otherwise (git-ignored, so a clone stays clean): ``mlruns.db`` and ``mlartifacts/`` (MLflow),
``multirun/`` (each cell's log, config and last checkpoint), ``leaderboards/``. Every step is an
ordinary ``rlbench`` command, printed before it runs, so the demo is also the recipe for
reproducing the committed leaderboard (``rlbench board --out leaderboards`` on the demo's store).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from harness.config import compose_config

SWEEP = "countdown_baselines"
DEFAULT_DIR = "rlbench-demo"


def _run(args: list[str], env: dict[str, str]) -> None:
    cmd = [sys.executable, "-m", "harness.cli", *args]
    print("\n$ rlbench " + " ".join(shlex.quote(a) for a in args), flush=True)
    code = subprocess.call(cmd, env=env)
    if code != 0:
        raise SystemExit(code)


def run_demo(directory: str | None = None) -> None:
    start = time.perf_counter()
    root = Path(directory or DEFAULT_DIR).resolve()
    root.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{root / 'mlruns.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    jobs = max(1, min(os.cpu_count() or 1, 18))  # 18 cells in sweep=countdown_baselines
    # the named sweep owns its experiment, so smoke runs in the default one never join its rows
    experiment = compose_config([f"sweep={SWEEP}"]).tracking.experiment
    _run(["pretrain", "model=tiny", "task=countdown"], env)
    _run([
        "sweep",
        f"sweep={SWEEP}",
        "hydra/launcher=joblib",
        f"hydra.launcher.n_jobs={jobs}",
        f"hydra.sweep.dir={root / 'multirun'}/${{now:%Y%m%d-%H%M%S}}",
        "trainer.status_every=50",
    ], env)
    boards = root / "leaderboards"
    # a local demo may run from a modified checkout; the board then says so
    _run(["board", "--experiment", experiment, "--out", str(boards), "--allow-dirty"], env)
    minutes = (time.perf_counter() - start) / 60
    print(
        f"\nDone in {minutes:.1f} min. Everything is under {root}:\n"
        f"  leaderboards:  {boards / 'README.md'}\n"
        f"  MLflow runs:   {uri}  (experiment {experiment!r})\n"
        f"  cells:         {root / 'multirun'} (log, config, last checkpoint of each)\n"
        f"  browse them:   rlbench ui --uri {uri}",
        flush=True,
    )
