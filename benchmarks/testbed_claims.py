"""Paired claims on the tiny-Countdown testbed (issue 4): variant - baseline per seed for final
pass@1, pass@8 and the mean rollout entropy of steps 51-60, with 95% intervals (harness.stats).

Run from the directory holding mlruns.db after the testbed sweeps:
    rlbench sweep algorithm=grpo,dr_grpo,maxrl,cispo,gppo seed=0,1,2,3,4 tracking.experiment=testbed
    rlbench sweep algorithm=lpo_fwd,lpo_rev algorithm.advantage.tau=sigma_g,one,mu_g \\
        seed=0,1,2,3,4 tracking.experiment=testbed
    rlbench sweep algorithm=agpo,grpo_aem seed=0,1,2,3,4 tracking.experiment=testbed
    python benchmarks/testbed_claims.py
"""
from collections import defaultdict

from mlflow.tracking import MlflowClient

from harness.stats import paired_interval

c = MlflowClient("sqlite:///mlruns.db")
exp = c.get_experiment_by_name("testbed").experiment_id
FINISHED = "tags.`rlbench.kind` = 'train' and attributes.status = 'FINISHED'"
runs = c.search_runs([exp], filter_string=FINISHED)
rows = defaultdict(dict)  # label -> seed -> (pass1, pass8, entropy)
for r in runs:
    alg = r.data.tags["rlbench.algorithm"]
    tau = r.data.params.get("algorithm.advantage.tau")
    label = f"{alg}@{tau}" if alg.startswith("lpo") else alg
    hist = sorted(c.get_metric_history(r.info.run_id, "rollout/entropy"), key=lambda m: m.step)
    late = [m.value for m in hist if m.step > 50]  # steps 51..60
    m = r.data.metrics
    rows[label][int(r.data.tags["rlbench.seed"])] = (
        m["final/heldout/pass_at_1"], m["final/heldout/pass_at_8"], sum(late) / len(late))
pairs = [("lpo_fwd@sigma_g", "grpo"), ("lpo_fwd@one", "dr_grpo"), ("lpo_fwd@mu_g", "maxrl"),
         ("lpo_rev@sigma_g", "grpo"), ("lpo_rev@one", "dr_grpo"), ("lpo_rev@mu_g", "maxrl"),
         ("agpo", "grpo"), ("grpo_aem", "grpo"), ("cispo", "grpo"), ("gppo", "grpo")]
print(f"{'variant':<16} {'base':<8} {'n':>2}  {'Δ pass@1':>18} {'Δ pass@8':>18} "
      f"{'Δ entropy(51-60)':>20}")
for a, b in pairs:
    if a not in rows or b not in rows:
        continue
    out = []
    for i in range(3):
        iv = paired_interval({s: v[i] for s, v in rows[a].items()},
                             {s: v[i] for s, v in rows[b].items()})
        mark = "†" if iv.n > 1 and (iv.low > 0 or iv.high < 0) else " "
        out.append(f"{iv.mean:+.3f} [{iv.low:+.3f},{iv.high:+.3f}]{mark}")
    print(f"{a:<16} {b:<8} {iv.n:>2}  " + "  ".join(out))
print()
for label, seeds in sorted(rows.items()):
    n = len(seeds)
    means = [sum(v[k] for v in seeds.values()) / n for k in range(3)]
    print(f"{label:<16} n={n} pass@1 {means[0]:.3f} pass@8 {means[1]:.3f} "
          f"entropy(51-60) {means[2]:.3f}")
