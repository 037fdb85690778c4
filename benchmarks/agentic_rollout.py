"""Multi-turn rollout throughput on the tiny two-hop agentic task: trajectories/s, tool calls/s
and the share of rollout time spent inside tools, for the plain group rollout (GRPO) and ARPO's
entropy branching, on the same warm-started tiny model and prompts.

    python benchmarks/agentic_rollout.py --steps 3 --threads 2
    python benchmarks/agentic_rollout.py --pretrain-steps 60   # a lighter warm start (faster)

Each "step" is one training-step rollout (data.prompts_per_step prompts x rollout.n); training is
not run. Run by hand; figures go in the issue note, never into a test.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time


def measure(algorithm: str, steps: int, threads: int, overrides: list[str]) -> dict[str, float]:
    from harness.cli import compose_config
    from harness.rollout import RolloutContext
    from harness.trainer import Trainer

    with tempfile.TemporaryDirectory() as out:
        cfg = compose_config([f"algorithm={algorithm}", "task=agentic_qa", "model=tiny",
                              "tracking.enabled=false", f"backend.threads={threads}",
                              f"trainer.output_dir={out}", *overrides])
        trainer = Trainer(cfg)
        trainer.setup()
        env = trainer.task.tool_env()
        tool_time = [0.0]
        for name, tool in list(env.tools.items()):
            def timed(query: str, tool=tool) -> str:
                t0 = time.perf_counter()
                try:
                    return tool(query)
                finally:
                    tool_time[0] += time.perf_counter() - t0
            env.tools[name] = timed
        trainer.task.tool_env = lambda: env
        rows = []
        for _ in range(steps):
            ctx = RolloutContext(engine=trainer.engine, task=trainer.task,
                                 draw_prompts=trainer.sampler.draw,
                                 prompts_per_step=cfg.data.prompts_per_step,
                                 sampling=trainer.sampling)
            tool_time[0] = 0.0
            t0 = time.perf_counter()
            batch = trainer.algorithm.rollout(ctx)
            wall = time.perf_counter() - t0
            calls = sum(len(t.tool_calls) for t in batch.trajectories)
            rows.append({"traj_per_s": len(batch) / wall, "calls_per_s": calls / wall,
                         "tool_share": tool_time[0] / wall,
                         "calls_per_traj": calls / max(len(batch), 1), "wall_s": wall})
        return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--pretrain-steps", type=int, default=None)
    args = p.parse_args()
    extra = [] if args.pretrain_steps is None else [f"model.pretrain.steps={args.pretrain_steps}"]
    print(f"{'algorithm':<10} {'traj/s':>8} {'calls/s':>8} {'tool share':>10} "
          f"{'calls/traj':>10} {'rollout s':>9}")
    for alg in ("grpo", "arpo"):
        r = measure(alg, args.steps, args.threads, extra)
        print(f"{alg:<10} {r['traj_per_s']:8.1f} {r['calls_per_s']:8.1f} "
              f"{r['tool_share']:10.1%} {r['calls_per_traj']:10.2f} {r['wall_s']:9.2f}")


if __name__ == "__main__":
    main()
