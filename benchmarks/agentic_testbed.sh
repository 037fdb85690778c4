#!/usr/bin/env bash
# Issue 8's CPU comparison on the tiny two-hop agentic task: GRPO vs ARPO vs AEPO vs GRPO+AEM,
# 5 seeds each, one MLflow experiment, then the leaderboard (pass@1, pass@8, tool calls per
# answer). Run from the directory that holds (or will hold) mlruns.db:
#   bash /path/to/rlbench/benchmarks/agentic_testbed.sh [out_dir]
# Warm start: 500 steps x 64 traces (a 100-step warm start learns the tags but answers nothing;
# 500 steps reach heldout pass@1 0.76, pass@8 0.98, 1.9 tool calls per trajectory). It is built
# once before the sweep so that two joblib workers do not both build it (~5 min unloaded).
# M = rollout.n = 16 trajectories per prompt, as in the ARPO paper; ARPO/AEPO start N = 8 roots
# (their default initial_rollouts) and branch into the other 8 after tool calls; GRPO and
# GRPO+AEM sample 16 i.i.d. A small recipe (4 prompts x 16 per step, 16 steps, 40 held-out
# problems x 8 samples at steps 0, 8, 16) so that the 20 runs fit in ~50 min on 2 cores: the
# multi-turn HF rollout runs ~4 trajectories/s on one core (40% of it in the KV-cache
# concatenation of transformers' DynamicCache).
set -euo pipefail
OUT=${1:-leaderboards/testbed-agentic}
MODEL=(model=tiny model.pretrain.steps=500 model.pretrain.batch_size=64)
rlbench pretrain task=agentic_qa "${MODEL[@]}"
rlbench sweep seed=0,1,2,3,4 algorithm=grpo,arpo,aepo,grpo_aem task=agentic_qa "${MODEL[@]}" \
    data.prompts_per_step=4 rollout.n=16 trainer.steps=16 trainer.eval_every=8 \
    task.tiny.eval.heldout.limit=40 trainer.status_every=4 tracking.experiment=testbed_agentic \
    hydra/launcher=joblib hydra.launcher.n_jobs=2 backend.threads=1
rlbench board --experiment testbed_agentic --out "$OUT"
