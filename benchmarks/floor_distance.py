"""How far rlbench is from the arithmetic floor of the machine it runs on: the RL step and
``rlbench demo``, each as a multiple of its floor, measured together in one run.

The floor (``benchmarks/arithmetic_floor.py``) is the time the tiny model's linear layers alone
would take for the same work at the throughput this machine measures for their shapes, so it
moves with the machine and with whatever else runs on it; a multiple of it measured in the same
run does not. Each run, in this order:

1. **floor**: ``arithmetic_floor.measure`` (``F.linear`` timed at the model's shapes) for the
   default step and for the demo;
2. **step**: ``step_time.py``'s interleaved measurement in this process, TRL's ``GRPOTrainer``
   step k then rlbench's ``Trainer.train_step`` k (``--skip-trl``: rlbench alone); medians of
   the measured steps;
3. **demo**: ``rlbench demo`` in a subprocess with an empty model cache (the warm start is part
   of the demo and of its floor), timed end to end, against ``arithmetic_floor.py``'s demo floor
   (the warm start, and 18 cells over two one-thread workers, each counted as a GRPO cell that
   trains every sample of the warm start's batch at every step). Beside it, a floor of the work
   the cells did, from their MLflow runs: generation per generated token
   (``final/tokens_total``: a DAPO cell's refills count) and the update per trained token
   (``final/tokens_trained``: groups with zero advantage are not trained, and padding is not
   counted), plus the evaluations; stricter than the first (lower), and printed per algorithm.

Printed per run and as the median of ``--runs`` runs, with the 1-minute load average before
and after each phase. Run it on a quiet machine; nothing here is a test (the figures depend on
the machine and its load)::

    python benchmarks/floor_distance.py --runs 3
    python benchmarks/floor_distance.py --runs 1 --skip-demo     # the step only (a minute)
    python benchmarks/floor_distance.py --runs 1 --skip-demo model.pretrain.steps=30  # overrides

Hydra overrides (``key=value``) apply to the step and its floor, not to the demo.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STEP_GOAL, DEMO_GOAL = 1.6, 2.0


def _script(name: str) -> Any:
    """A sibling benchmark script as a module (benchmarks/ is not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load() -> float:
    return os.getloadavg()[0]


def measure_step(threads: int, skip_trl: bool, steps: int = 10, warmup: int = 3,
                 overrides: tuple[str, ...] = ()) -> dict[str, float]:
    """Median rlbench step (and TRL's, interleaved) as ``step_time.py`` measures them."""
    st = _script("step_time")
    args, overrides = st.parse_args(["--threads", str(threads), "--steps", str(steps),
                                     "--warmup", str(warmup), *overrides])
    with tempfile.TemporaryDirectory(prefix="rlbench-floor-") as out:
        runner = st.RlbenchRunner(st.build_rlbench(args, overrides, out), args.warmup)
        trainer = runner.trainer
        out_: dict[str, float] = {}
        if skip_trl:
            for _ in range(args.warmup + args.steps):
                runner.step()
        else:
            theirs, _ = _script("trl_side").run_trl(
                trainer.cfg, trainer.model_path, trainer.task, threads, args.warmup,
                args.steps, after_step=runner.step)
            out_["trl"] = st.med(theirs.step)
        runner.close()
    ours = runner.result
    out_.update(step=st.med(ours.step), gen=st.med(ours.stages["gen"]),
                update=st.med(ours.stages["update"]))
    return out_


def measure_demo(floors: Any) -> dict[str, Any]:
    """``rlbench demo`` from an empty model cache, timed; its cells' floors from their runs."""
    from mlflow.tracking import MlflowClient

    with tempfile.TemporaryDirectory(prefix="rlbench-floor-demo-") as tmp:
        env = {**os.environ, "RLBENCH_CACHE": str(Path(tmp) / "cache")}
        env.pop("MLFLOW_TRACKING_URI", None)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "harness.cli", "demo", "--dir",
                               str(Path(tmp) / "demo")], env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"rlbench demo failed (exit {proc.returncode}):\n"
                             f"{proc.stderr[-3000:]}")
        client = MlflowClient(f"sqlite:///{Path(tmp) / 'demo' / 'mlruns.db'}")
        exp = client.get_experiment_by_name("countdown_baselines")
        runs = [r for r in client.search_runs([exp.experiment_id])
                if r.info.status == "FINISHED" and "final/tokens_total" in r.data.metrics]
    f = floors
    gen_rate = f.cell_gen1 / f.step_response_tokens      # one thread, per generated token
    update_rate = f.cell_update1 / f.step_response_tokens  # one thread, per trained token
    cells = []
    for r in runs:
        m = r.data.metrics
        floor = (gen_rate * m["final/tokens_total"] + update_rate * m["final/tokens_trained"]
                 + f.evals * f.cell_eval1)
        cells.append({"algorithm": r.data.tags.get("rlbench.algorithm", "?"),
                      "wall": m["final/wall_s"], "floor": floor})
    by_work = f.demo_warm + sum(c["floor"] for c in cells) / 2
    return {"wall": wall, "floor": f.demo, "by_work": by_work, "cells": cells}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-trl", action="store_true")
    ap.add_argument("--skip-demo", action="store_true")
    ap.add_argument("--steps", type=int, default=10, help="measured steps per run")
    ap.add_argument("--warmup", type=int, default=3, help="discarded steps per run")
    args, overrides = ap.parse_known_args(argv)
    bad = [a for a in overrides if a.startswith("-") or "=" not in a]
    if bad:
        ap.error(f"unrecognized arguments: {' '.join(bad)} (overrides look like key=value)")
    af = _script("arithmetic_floor")
    results = []
    for run in range(1, args.runs + 1):
        row: dict[str, Any] = {"load": [load()]}
        floors = af.measure(args.threads, overrides=tuple(overrides))
        row["load"].append(load())
        row["floors"] = floors
        row.update(measure_step(args.threads, args.skip_trl, args.steps, args.warmup,
                                tuple(overrides)))
        row["load"].append(load())
        if not args.skip_demo:
            row["demo"] = measure_demo(floors)
            row["load"].append(load())
        results.append(row)
        _print_run(run, row)
    if len(results) > 1:
        _print_summary(results)
    return 0


def _print_run(run: int, row: dict[str, Any]) -> None:
    f = row["floors"]
    print(f"\n== run {run}: 1-minute load {' -> '.join(f'{x:.2f}' for x in row['load'])} "
          "(start, after floor, step, demo) ==")
    print(f"  matrix products   {f.gflops:.0f} GFLOP/s on {f.threads} threads ({f.batch})")
    print(f"  step              rlbench {row['step']:.4f} s (gen {row['gen']:.4f}, update "
          f"{row['update']:.4f}) | floor {f.step:.4f} s (gen {f.step_gen:.4f}, update "
          f"{f.step_update:.4f}) | {row['step'] / f.step:.2f}x the floor "
          f"(gen {row['gen'] / f.step_gen:.2f}x, update {row['update'] / f.step_update:.2f}x)")
    if "trl" in row:
        print(f"  TRL step          {row['trl']:.4f} s = {row['trl'] / f.step:.2f}x the floor; "
              f"rlbench / TRL {row['step'] / row['trl']:.3f}")
    if "demo" in row:
        d = row["demo"]
        print(f"  demo              {d['wall']:.1f} s | floor {d['floor']:.1f} s (warm start "
              f"{f.demo_warm:.1f} s + {f.demo_cells} GRPO cells of {f.demo_cell:.1f} s over two "
              f"workers) | {d['wall'] / d['floor']:.2f}x the floor; by the cells' own work "
              f"{d['by_work']:.1f} s ({d['wall'] / d['by_work']:.2f}x)")
        by_alg: dict[str, list[dict]] = {}
        for c in d["cells"]:
            by_alg.setdefault(c["algorithm"], []).append(c)
        for alg, cs in sorted(by_alg.items()):
            wall = statistics.fmean(c["wall"] for c in cs)
            floor = statistics.fmean(c["floor"] for c in cs)
            print(f"    {alg:<14} cell {wall:5.1f} s in its process (final/wall_s), floor of "
                  f"its work {floor:5.1f} s: {wall / floor:.2f}x")


def _print_summary(results: list[dict[str, Any]]) -> None:
    med = statistics.median
    steps = [r["step"] / r["floors"].step for r in results]
    print(f"\n== median of {len(results)} runs ==")
    print(f"  step  {med(steps):.2f}x its floor (runs: {', '.join(f'{x:.2f}' for x in steps)}); "
          f"goal <= {STEP_GOAL}x: {'met' if max(steps) <= STEP_GOAL else 'NOT met'} in every run")
    if all("trl" in r for r in results):
        trl = [r["trl"] / r["floors"].step for r in results]
        print(f"  TRL   {med(trl):.2f}x the same floor")
    if all("demo" in r for r in results):
        demos = [r["demo"]["wall"] / r["demo"]["floor"] for r in results]
        work = [r["demo"]["wall"] / r["demo"]["by_work"] for r in results]
        print(f"  demo  {med(demos):.2f}x its floor (runs: {', '.join(f'{x:.2f}' for x in demos)});"
              f" goal <= {DEMO_GOAL}x: {'met' if max(demos) <= DEMO_GOAL else 'NOT met'} in "
              f"every run; {med(work):.2f}x the floor of the cells' own work")


if __name__ == "__main__":
    raise SystemExit(main())
