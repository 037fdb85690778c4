#!/usr/bin/env bash
# Regenerate committed leaderboards at one commit (issue 20): for each board, its named sweep and
# its board command, the two commands written on the board. Run from the repository root of a
# clean checkout (rlbench board refuses uncommitted changes outside leaderboards/); runs go to
# ./mlruns.db (or $MLFLOW_TRACKING_URI), and a rerun skips every cell that already FINISHED.
#   bash benchmarks/regenerate_boards.sh                     every board (hours: leaderboards/README.md)
#   bash benchmarks/regenerate_boards.sh testbed-offpolicy   one or more boards by name
# The warm starts some sweeps need are built first, so two joblib workers never both build one.
# Keep logs outside the checkout: rlbench board refuses untracked files as uncommitted changes.
set -euo pipefail
LAUNCH=(hydra/launcher=joblib hydra.launcher.n_jobs="${N_JOBS:-2}" backend.threads=1
        trainer.status_every=20)

board() {  # name sweep experiment [board args...]
  local name=$1 sweep=$2 experiment=$3
  shift 3
  rlbench sweep "sweep=$sweep" "${LAUNCH[@]}"
  rlbench board --experiment "$experiment" --out "leaderboards/$name" "$@"
}

run() {
  case $1 in
    countdown-baselines) board countdown-baselines countdown_baselines countdown_baselines ;;
    testbed-onpolicy) board testbed-onpolicy testbed_onpolicy testbed_onpolicy ;;
    testbed-offpolicy)  # tuning seeds, then the reported seeds at each row's chosen rate
      python benchmarks/offpolicy_testbed.py --jobs "${N_JOBS:-2}" \
        --tracking-uri "${MLFLOW_TRACKING_URI:-sqlite:///$PWD/mlruns.db}"
      rlbench board --experiment testbed_offpolicy_tuned --out leaderboards/testbed-offpolicy \
        --config conf/board/offpolicy_tuned.yaml ;;
    lpo-lr-tuned) board lpo-lr-tuned lpo_lr_tuning lpo_lr_tuning \
                    --config conf/board/lpo_lr_tuned.yaml ;;
    testbed-rollout)
      rlbench pretrain model=tiny_lorem task=countdown
      board testbed-rollout rollout_testbed testbed_rollout ;;
    testbed-agentic)
      rlbench pretrain task=agentic_qa model=tiny model.pretrain.steps=500 \
        model.pretrain.batch_size=64
      board testbed-agentic agentic_testbed testbed_agentic ;;
    math-tiny)
      rlbench pretrain model=tiny task=math_tiny model.pretrain.steps=400
      board math-tiny math_tiny math-tiny ;;
    code-tiny)
      rlbench pretrain model=tiny task=code model.pretrain.steps=400
      board code-tiny code_tiny code-tiny ;;
    geometry3k-tiny)
      rlbench pretrain model=tiny_vlm task=geometry3k_tiny
      board geometry3k-tiny geometry3k_tiny geometry3k-tiny ;;
    lantern)  # its own track: one process, its own sweep and board writer
      rlbench sweep track=lantern sweep=targets
      rlbench sweep track=lantern sweep=targets_aa  # its A/A control
      rlbench board --track lantern --out leaderboards/lantern ;;
    *) echo "unknown board $1" >&2; exit 2 ;;
  esac
}

BOARDS=(countdown-baselines testbed-onpolicy testbed-offpolicy lpo-lr-tuned testbed-rollout
        testbed-agentic math-tiny code-tiny geometry3k-tiny lantern)
(( $# )) && BOARDS=("$@")
rlbench pretrain model=tiny task=countdown
for name in "${BOARDS[@]}"; do run "$name"; done
