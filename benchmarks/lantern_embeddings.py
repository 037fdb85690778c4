"""Cosine similarities of the LANTERN track's state descriptions under the packaged
all-MiniLM-L6-v2 (offline): paraphrase vs unrelated pairs, and each target state's best source
state for every target task in conf/lantern/task/. Prints a markdown table.

    OMP_NUM_THREADS=1 python benchmarks/lantern_embeddings.py
"""

from __future__ import annotations

import time

from lantern.embed import Embedder, cosine, load_model
from lantern.track import build_dfa, compose

PAIRS = [
    ("The agent must get coffee next, while avoiding decorations.",
     "Next, the agent has to fetch coffee and keep away from the decorations.", "paraphrase"),
    ("The agent must go to the office next.", "Head to the office now.", "paraphrase"),
    ("The agent must get coffee next, while avoiding decorations.",
     "The agent must get mail next, while avoiding decorations.", "same frame, other subgoal"),
    ("The agent must get coffee next, while avoiding decorations.",
     "The agent must get wood next, while avoiding lava.", "other world"),
    ("The agent must get coffee next, while avoiding decorations.",
     "The task is complete: every subgoal has been achieved.", "unrelated"),
]
TASKS = ["office_cmo", "office_mco", "craft_wif", "office_cmo_paraphrased", "office_cmo_mirrored",
         "office_cmo_craftsrc"]


def main() -> None:
    t0 = time.time()
    load_model()
    print(f"model loaded offline in {time.time() - t0:.2f} s\n")
    emb = Embedder()
    print("| text a | text b | kind | cosine |\n|---|---|---|---|")
    for a, b, kind in PAIRS:
        c = cosine(emb.embed([a]), emb.embed([b]))[0, 0]
        print(f"| {a} | {b} | {kind} | {c:.3f} |")
    print("\n| target task | target state | best source state | cosine |\n|---|---|---|---|")
    for task in TASKS:
        cfg = compose([f"task={task}", "tracking.enabled=false"])
        _, dfa = build_dfa(cfg, cfg.task.env, cfg.task.description)
        live = [q for q in range(dfa.n_states) if q not in dfa.accepting | dfa.rejecting]
        cands = []
        for spec in cfg.task.sources:
            _, sd = build_dfa(cfg, spec.env, spec.description)
            cands += [(f"{spec.env}: {sd.descriptions[q]}") for q in range(sd.n_states)
                      if q not in sd.accepting | sd.rejecting]
        texts = [c.split(": ", 1)[1] for c in cands]
        sims = cosine(emb.embed([dfa.descriptions[q] for q in live]), emb.embed(texts))
        for i, q in enumerate(live):
            j = int(sims[i].argmax())
            print(f"| {task} | {dfa.descriptions[q]} | {cands[j]} | {sims[i, j]:.3f} |")


if __name__ == "__main__":
    main()
