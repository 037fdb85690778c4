"""What a training run prints and how it stops: the per-step status line, the evaluation line
and the end-of-run text, and the SIGINT/SIGTERM handlers that let the loop stop at a step boundary
(:mod:`harness.trainer` owns the loop; this module holds no state). The summary rule is in
:mod:`harness.summary`.
"""

from __future__ import annotations

import contextlib
import resource
import signal
from collections.abc import Mapping
from typing import Any


class RunInterrupted(BaseException):
    """Raised after a signal stopped the loop (a BaseException so ``except Exception`` in user
    code cannot swallow it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum


def status_line(run_name: str, step: int, steps: int, m: Mapping[str, float], eta_s: float) -> str:
    nan = float("nan")
    return (f"[{run_name}] step {step}/{steps} "
            f"reward {m.get('rollout/reward_mean', nan):.3f} "
            f"acc {m.get('rollout/acc', nan):.3f} "
            f"len {m.get('rollout/response_len_mean', nan):.1f} "
            f"ent {m.get('rollout/entropy', nan):.3f} "
            f"gn {m.get('actor/grad_norm', nan):.3f} "
            f"{m['time/step']:.2f}s eta {fmt_s(eta_s)}")


def eval_line(run_name: str, step: int, m: Mapping[str, float]) -> str:
    """The status line of an evaluation: its pass@k values and how long it took."""
    parts = " ".join(f"{k[5:]}={v:.3f}" for k, v in m.items() if "/pass_at_" in k)
    return f"[{run_name}] eval step {step}: {parts} ({m.get('time/eval', 0.0):.1f}s)"


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def finish_text(run_name: str, summary: Mapping[str, float], warm_start_s: float, *,
                run_id: str | None, uri: str | None, experiment: str, output_dir: Any,
                checkpoint: Any) -> str:
    """The end-of-run summary: what ran, where it is, and what to look at next."""
    evals = "  ".join(f"{k[len('final/'):]}={v:.3f}" for k, v in summary.items()
                      if k.startswith("final/") and ("/pass_at_1" in k or "/mean_at_" in k))
    lines = [f"[{run_name}] finished {int(summary['final/steps'])} steps in "
             f"{fmt_s(summary['final/wall_s'])} (warm start {fmt_s(warm_start_s)})"
             + (f": {evals}" if evals else "")]
    if run_id is not None:
        lines += [f"  run id:      {run_id}",
                  f"  MLflow:      {uri} (experiment {experiment!r}; browse: rlbench ui)"]
    lines.append(f"  output dir:  {output_dir}")
    if checkpoint is not None:
        lines.append(f"  checkpoint:  {checkpoint}")
    if run_id is not None:
        lines.append(f"  evaluate:    rlbench eval run_id={run_id}")
    return "\n".join(lines)


def fmt_s(seconds: float) -> str:
    s = round(seconds)
    return f"{s}s" if s < 60 else (f"{s // 60}m{s % 60:02d}s" if s < 3600
                                   else f"{s // 3600}h{(s % 3600) // 60:02d}m")


def install_handlers(handler: Any) -> dict[int, Any]:
    old: dict[int, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
            old[sig] = signal.signal(sig, handler)
    return old


def restore_handlers(old: dict[int, Any]) -> None:
    for sig, h in old.items():
        signal.signal(sig, h)
