"""An estimate of the suite's wall time (conf/sweep/suite.yaml) from one short GRPO run per recipe.

For each tiny recipe in conf/recipe/ this trains GRPO seed 0 for ``--steps`` steps (evaluating at
step 0 and at the end), reads the run's per-step and per-evaluation times back from MLflow, and
extrapolates to the recipe's own step and evaluation counts:

    cell ~ steps * mean(time/step) + evaluations * mean(time/eval)

A warm start (model.pretrain) is built once per recipe and cached, so it is not part of a cell.
Algorithms differ in cost per step (LOPE resamples, ARPO/AEPO branch, DAPO over-samples): this is
GRPO's cost, an estimate, not a measurement of the suite.

    nice -n 10 python benchmarks/suite_cell_time.py --steps 4 --out /tmp/suite-timing
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

RECIPES = ("countdown_tiny", "math_tiny", "code_tiny", "geometry3k_tiny", "agentic_tiny")


def evaluations(steps: int, every: int) -> int:
    """Evaluations of a run: step 0, every ``every`` steps, and the last step."""
    if every <= 0:
        return 1
    marks = set(range(0, steps + 1, every)) | {steps}
    return len(marks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--recipes", default=",".join(RECIPES))
    args = parser.parse_args()
    import mlflow

    from harness.config import compose_config

    args.out.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{args.out / 'mlruns.db'}"
    rows = []
    for recipe in args.recipes.split(","):
        full = compose_config([f"recipe={recipe}", "algorithm=grpo"])
        overrides = [f"recipe={recipe}", "algorithm=grpo", "seed=0",
                     f"trainer.steps={args.steps}", f"trainer.eval_every={args.steps}",
                     f"tracking.uri={uri}", f"tracking.experiment=timing_{recipe}",
                     f"trainer.output_dir={args.out / recipe}", "backend.threads=1"]
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "harness.cli", "train", *overrides], check=True)
        wall = time.perf_counter() - t0
        client = mlflow.MlflowClient(uri)
        exp = client.get_experiment_by_name(f"timing_{recipe}")
        run = client.search_runs([exp.experiment_id])[0]
        step_t = [m.value for m in client.get_metric_history(run.info.run_id, "time/step")]
        eval_t = [m.value for m in client.get_metric_history(run.info.run_id, "time/eval")]
        per_step = sum(step_t) / max(len(step_t), 1)
        per_eval = sum(eval_t) / max(len(eval_t), 1)
        steps, every = int(full.trainer.steps), int(full.trainer.eval_every)
        n_eval = evaluations(steps, every)
        rows.append({"recipe": recipe, "short_run_wall_s": round(wall, 1),
                     "per_step_s": round(per_step, 2), "per_eval_s": round(per_eval, 2),
                     "recipe_steps": steps, "recipe_evals": n_eval,
                     "cell_estimate_s": round(steps * per_step + n_eval * per_eval)})
        print(json.dumps(rows[-1]), flush=True)
    (args.out / "timing.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
