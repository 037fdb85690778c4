#!/usr/bin/env bash
# Issue 8's CPU comparison on the tiny two-hop agentic task: GRPO vs ARPO vs AEPO vs GRPO+AEM,
# 5 seeds each, one MLflow experiment, then the leaderboard (pass@1, pass@8, tool calls per
# answer). Run from the directory that holds (or will hold) mlruns.db:
#   bash /path/to/rlbench/benchmarks/agentic_testbed.sh [out_dir]
# Warm start: 500 steps x 64 traces (a 100-step warm start learns the tags but answers nothing;
# 500 steps reach heldout pass@1 0.76, pass@8 0.98, 1.9 tool calls per trajectory). It is built
# once before the sweep so that two joblib workers do not both build it.
# M = rollout.n = 8 trajectories per prompt; ARPO/AEPO start N = 4 roots and may branch into the
# other 4 after tool calls (with N = M = 8 there is no branch budget and ARPO is GRPO).
set -euo pipefail
OUT=${1:-leaderboards/testbed-agentic}
MODEL=(model=tiny model.pretrain.steps=500 model.pretrain.batch_size=64)
COMMON=(task=agentic_qa "${MODEL[@]}" seed=0,1,2,3,4 tracking.experiment=testbed_agentic
        data.prompts_per_step=16 rollout.n=8 trainer.steps=40 trainer.eval_every=20
        task.tiny.eval.heldout.limit=100 trainer.status_every=10
        hydra/launcher=joblib hydra.launcher.n_jobs=2)
rlbench pretrain task=agentic_qa "${MODEL[@]}"
rlbench sweep algorithm=grpo,grpo_aem "${COMMON[@]}"
rlbench sweep algorithm=arpo,aepo algorithm.rollout.initial_rollouts=4 "${COMMON[@]}"
rlbench board --experiment testbed_agentic --out "$OUT"
