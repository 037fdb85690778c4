#!/usr/bin/env bash
# Issue 5's CPU testbed: tiny Countdown (~1/3 of the 32 groups per step are all wrong at the warm
# start), 5 seeds: GRPO; LOPE and its ablations (resample only, + policy shaping, + advantage
# shaping = full); arbitrary-entropy PO at two target entropies. One MLflow experiment, then the
# leaderboard. Run from the directory that holds (or will hold) mlruns.db:
#   bash /path/to/rlbench/benchmarks/rollout_testbed.sh [out_dir]
# The tiny model's prompts are ~10 characters, so LOPE's Lorem prefix is 1-3 words (the paper's
# 100-300 words would be 50x the prompt the model was warm-started on).
set -euo pipefail
OUT=${1:-leaderboards/testbed-rollout}
SEEDS=0,1,2,3,4
COMMON=(seed=$SEEDS tracking.experiment=testbed_rollout hydra/launcher=joblib
        hydra.launcher.n_jobs=2 trainer.status_every=30)
LOREM=(algorithm.rollout.word_min=1 algorithm.rollout.word_max=3 "algorithm.rollout.separator=' '")
# LOPE on the tiny model warm-started with Lorem noise prefixes (model=tiny_lorem): the plain tiny
# model answers nothing once a prefix is in front (first testbed: 0% accuracy on perturbed
# prompts), so LOPE there can only waste its extra generation.
LM=(model=tiny_lorem)
rlbench sweep algorithm=grpo "${LM[@]}" "${COMMON[@]}"
rlbench sweep algorithm=lope "${LM[@]}" "${LOREM[@]}" "${COMMON[@]}"
# Arbitrary-entropy PO at two targets on the plain tiny model (GRPO's final entropy is ~0.35).
rlbench sweep algorithm=grpo "${COMMON[@]}"
rlbench sweep algorithm=arbitrary_entropy algorithm.rollout.target_entropy=0.25,0.6 \
    "${COMMON[@]}"
# Ablations, last: resample only on both models (the plain-tiny runs show the no-rescue regime).
rlbench sweep algorithm=lope "${LM[@]}" "${LOREM[@]}" algorithm.loss.policy_shaping=false \
    algorithm.advantage.shaping=false '+tracking.tags={rlbench.variant:resample_only}' \
    "${COMMON[@]}"
rlbench sweep algorithm=lope "${LOREM[@]}" algorithm.loss.policy_shaping=false \
    algorithm.advantage.shaping=false '+tracking.tags={rlbench.variant:resample_only}' \
    "${COMMON[@]}"
rlbench board --experiment testbed_rollout --out "$OUT"
