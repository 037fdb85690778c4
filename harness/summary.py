"""The summary rule: which evaluation a run's headline numbers come from.

``final/<set>/<metric>`` is the last evaluation, of the model training ended with (averaging it
with an earlier one would give a half-trained model half the weight); ``start/<set>/<metric>`` is
the step-0 evaluation when there was one. Only pass@k, mean@k and maj@k enter the summary; the
boards read ``final/*`` (harness/report/). The cost ledger's ``final/*`` keys (tokens, stage
times, memory) come from :class:`harness.ledger.CostLedger`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

SUMMARY_METRICS = ("/pass_at_", "/mean_at_", "/maj_at_")


def eval_summary(evals: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """``final/*`` (the last evaluation, of the model training ended with: never averaged with a
    mid-training one) and ``start/*`` (the step-0 evaluation)."""
    summary: dict[str, float] = {}
    evals = sorted(evals, key=lambda e: e["step"])
    keys = [k for k in (evals[-1] if evals else {}) if any(s in k for s in SUMMARY_METRICS)]
    for key in keys:
        summary["final/" + key[len("eval/"):]] = float(evals[-1][key])
        if evals[0]["step"] == 0 and key in evals[0]:
            summary["start/" + key[len("eval/"):]] = evals[0][key]
    return summary
