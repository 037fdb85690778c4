"""A leaderboard page: the markdown around the tables (what each table is, how the rows differ,
the learning-rate selection, the equal-budget view, duplicates and the runs behind each row)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from harness.report.analysis import Analysis
from harness.report.budget import TOLERANCE, Budget
from harness.report.config import BoardConfig
from harness.report.controls import Controls
from harness.report.controls import section as controls_section
from harness.report.curves import Curve
from harness.report.curves import section as curves_section
from harness.report.stats import Interval
from harness.report.tables import (
    Row,
    Run,
    Spec,
    budget_table,
    cell,
    cost_table,
    learning_check,
    markdown_table,
    paired_table,
    quality_table,
    start_table,
    step_table,
)
from harness.report.verdict import Verdict, primary_section

__all__ = ["Page", "notes_text", "render_markdown"]


@dataclass
class Page:
    """Everything one leaderboard page shows besides its rows' numbers."""

    title: str
    head: list[str]
    rows: list[Row]
    specs: list[Spec]
    plots: list[tuple[str, str]]
    outside: list[str] = field(default_factory=list)  # non-algorithm keys the rows differ in
    within: list[str] = field(default_factory=list)  # algorithm.* keys differing within an alg
    selection: list[tuple[str, list[tuple[str, Interval]], str]] = field(default_factory=list)
    budget: Budget = field(default_factory=Budget)
    duplicates: list[tuple[Row, str, list[Run]]] = field(default_factory=list)
    excluded: dict[str, int] = field(default_factory=dict)
    verdict: Verdict = field(default_factory=lambda: Verdict(None, Analysis()))
    controls: Controls = field(default_factory=Controls)
    curves: list[Curve] = field(default_factory=list)  # response curves (curves.py)


def notes_text(cfg: BoardConfig, default: str) -> dict[str, str]:
    """The explanation above each markdown table."""
    pct = f"{round(cfg.confidence * 100):d}%"
    rule = (f"a Student-t {pct} interval over seeds at every number of seeds (`mean ± "
            f"half-width (n)`, n = seeds that logged it; `n/a` with one seed; `± 0.000` when "
            f"every seed logged the same value, which is not a test and never marked)")
    return {
        "quality": (
            "Final value (the last evaluation: the model training ended with) per seed, then its "
            "mean over seeds "
            f"with {rule}. pass@k is the unbiased Codex estimator (Chen et al., 2021) over n "
            "samples per problem; mean@n is the mean reward over all n samples; maj@k the "
            "majority vote. **Bold**: the best mean in the column among rows with 2 or more "
            "seeds. Rows are ranked by the primary metric; T is the sampling temperature. "
            "Final token entropy: per seed, the mean of `rollout/entropy` (mean per-token "
            "full-vocabulary entropy of the training rollouts) over the run's last "
            f"{cfg.final_window} logged steps, never bolded. Tool calls per trajectory "
            "(multi-turn tasks): `eval/<set>/tool_calls_per_traj` (calls per sampled "
            "trajectory, answered or not) at the last evaluation (averaged over the eval sets), "
            "never bolded."),
        "paired": (
            "Descriptive: Δ = row − baseline, per seed, over the seeds both have (n = pairs), "
            f"with a per-column {pct} Student-t interval and no test or mark (the plan's one "
            "confirmatory comparison per row is above, under Primary comparisons). The "
            "baseline is the "
            "runs' `rlbench.baseline` tag, else the pairing config's `pairs` entry for "
            f"`algorithm@variant` or `algorithm` (`{cfg.source}`), else `{default}`; among "
            "several rows of that name, the one at the same temperature."),
        "start": ("Mean step-0 value → mean per-seed change (final − start), with its "
                  "interval. Learning check: for each row others are compared with, the seeds "
                  "on which its final pass@1 is above its step-0 value (a testbed whose "
                  "baseline does not learn cannot show a method improving on it)."),
        "step": (
            "Step size: the row's learning rate and gradient-clip threshold "
            "(`trainer.optim.lr`, `trainer.optim.grad_clip`), the pre-clip gradient norm "
            "(`actor/grad_norm`) and the share of optimizer steps whose pre-clip norm exceeded "
            "the threshold (`actor/grad_clipped_frac`), each averaged over every logged step of "
            "a run, then over seeds. A loss with a larger scale (LPO's seq-mean-token-sum) is "
            "clipped more often: with Adam, clipping is what turns loss scale into step size."),
        "cost": (
            "Summary metrics, mean over seeds with the same intervals: updates (`final/steps`), "
            "tokens generated in training rollouts (`final/tokens_total`), tokens that went "
            "through a backward pass (`final/tokens_trained`), wall seconds (`final/wall_s`), "
            "peak resident memory (`final/peak_mem_mb`) and peak GPU memory "
            "(`final/peak_gpu_mem_mb`); a column appears when some run logged it. **Bold**: "
            "the lowest among rows with 2 or more seeds."),
        "budget": (
            "Each run read at its evaluation nearest the budget (evaluations placed at "
            "`rollout/tokens_total` of their step), and only when it lies within "
            f"{TOLERANCE:.0%} of the budget's tokens: a measured evaluation, never a value "
            "interpolated between two. The budget is the largest `trainer.eval_at_tokens` mark "
            "every run was evaluated at (runs without marks: the smallest number of tokens any "
            "run generated by its last evaluation). A row that generates more tokens per step "
            "(DAPO's refills, LOPE's resamples, ARPO's branches) is read earlier in its "
            "training. \"step\" and \"tokens\" are where each row was read. **Bold** as above."),
    }


def _head_sections(page: Page, cfg: BoardConfig) -> list[str]:
    lines = []
    keys = (["algorithm"] if len({r.algorithm for r in page.rows}) > 1 else [])
    listed = [*keys, *page.within, *page.outside]
    lines.append("- Rows differ in: " + (", ".join(f"`{k}`" for k in listed) or "nothing")
                 + (" (and each algorithm's own `algorithm.*` knobs)" if keys else "")
                 + "; every other resolved config key but `seed` is the same in every run of "
                   "a row (a row is one configuration).")
    if page.duplicates:
        n = sum(len(rs) - 1 for _, _, rs in page.duplicates)
        lines.append(f"- {n} duplicate run(s) of a cell (same configuration and seed) were left "
                     "out: see \"Duplicate runs\" below.")
    return lines


def _config_table(page: Page) -> list[str]:
    keys = [*page.within, *page.outside]
    if not keys:
        return []
    cols = [[str(i) for i in range(1, len(page.rows) + 1)], [r.key for r in page.rows]]
    cols += [[r.config.get(k, "(not set)") for r in page.rows] for k in keys]
    return ["", "## Configuration", "", "The resolved config keys the rows differ in (besides the "
            "algorithm's own knobs).", "", *markdown_table(["#", "row", *(f"`{k}`" for k in keys)],
                                                   cols)]


def _selection(page: Page, cfg: BoardConfig) -> list[str]:
    if not page.selection or cfg.select is None:
        return []
    sel = cfg.select
    values = sorted({v for _, grid, _ in page.selection for v, _ in grid}, key=_num_key)
    cols: list[list[str]] = [[key for key, _, _ in page.selection]]
    for v in values:
        col = []
        for _, grid, chosen in page.selection:
            iv = dict(grid).get(v)
            text = "—" if iv is None else cell(iv)
            col.append(f"**{text}** ✓" if v == chosen and iv is not None else text)
        cols.append(col)
    return ["", "## Selection", "",
            f"Each row's `{sel.key.partition('.')[2]}` was chosen from the grid below by the mean "
            f"final `{sel.metric}` over seeds ({'highest' if sel.higher else 'lowest'} wins; ✓), "
            f"on the `{sel.eval_set}` split, which is disjoint from the eval sets reported above; "
            "every other table reports the chosen value only. The grid and the choice are "
            "recorded on this board's MLflow run.", "",
            *markdown_table(["row", *(f"{sel.key.rpartition('.')[2]}={v}" for v in values)], cols)]


def _num_key(v: str) -> tuple[int, float, str]:
    try:
        return (0, float(v), v)
    except ValueError:
        return (1, 0.0, v)


def _budget(page: Page, notes: dict[str, str]) -> list[str]:
    b = page.budget
    if math.isnan(b.tokens) or not any(r.budget for r in page.rows):
        return []
    read = (f"{b.read} run{'s' * (b.read != 1)} read within {b.worst:.1%} of it" if b.read
            else "no run read")
    missed = (f"; {b.missed} run{'s' * (b.missed != 1)} had no evaluation within "
              f"{TOLERANCE:.0%} and {'are' if b.missed != 1 else 'is'} left out of "
              "their rows (`n` counts the runs read)" if b.missed else "")
    return ["", "## Equal compute budget", "",
            f"Budget: {b.tokens:,.0f} tokens generated ("
            + ("a declared mark" if b.declared else "no declared mark: the smallest final "
               "evaluation's tokens") + f"); {read}{missed}. " + notes["budget"], "",
            *budget_table(page.rows, page.specs)]


def _duplicates(page: Page) -> list[str]:
    if not page.duplicates:
        return []
    lines = ["", "## Duplicate runs", "", "Several FINISHED runs of one cell (same configuration "
             "and seed); the newest is used and the others are listed here, not pooled.", ""]
    for row, seed, runs in page.duplicates:
        ids = ", ".join(f"`{r.shown_id}`" + (" (used)" if r is runs[-1] else "") for r in runs)
        lines.append(f"- **{row.key}** seed {seed}: {ids}")
    return lines


def footer(rows: list[Row], excluded: dict[str, int]) -> list[str]:
    """The runs behind each row and the excluded-runs footnote."""
    lines = ["<details><summary>MLflow runs behind each row</summary>", ""]
    for r in rows:
        # an A/A row's runs: the seed they are paired on, and the one they trained with
        ids = ", ".join(f"seed {s}" + (f" (trained with seed {t})" if (t := r.runs[s].train_seed)
                                       else "") + f": `{rid}`" for s, rid in r.run_ids)
        lines.append(f"- **{r.key}** (temperature {r.temperature or '?'}): {ids}")
    lines += ["", "</details>"]
    excl = sum(excluded.values())
    if excl:
        statuses = ", ".join(f"{s}: {c}" for s, c in sorted(excluded.items()))
        lines += ["", f"[^excluded]: {excl} non-FINISHED runs excluded ({statuses})."]
    return lines


def render_markdown(page: Page, cfg: BoardConfig, default: str) -> str:
    """The leaderboard page."""
    notes, rows, specs = notes_text(cfg, default), page.rows, page.specs
    lines = [f"# {page.title}", "", *page.head, *_head_sections(page, cfg)]
    lines += _config_table(page) + _selection(page, cfg)
    lines += ["", "## Quality (final)", "", notes["quality"], ""]
    lines += quality_table(rows, specs) if specs else ["No `final/<set>/pass_at_<k>` metrics."]
    lines += controls_section(page.controls) + primary_section(page.verdict, cfg)
    lines += curves_section(page.curves, cfg.confidence)
    lines += ["", "## Paired differences vs baseline (secondary, descriptive)", "",
              notes["paired"], ""]
    lines += paired_table(rows, specs, cfg.confidence)
    lines += ["", "## Change since step 0", "", notes["start"], "", *start_table(rows, specs)]
    lines += learning_check(rows, specs)
    lines += ["", "## Step size", "", notes["step"], "", *step_table(rows)]
    lines += ["", "## Cost", "", notes["cost"], "", *cost_table(rows)]
    lines += _budget(page, notes)
    lines += ["", "## Curves", ""]
    for name, alt in page.plots:
        lines += [f"![{alt}]({name})", ""]
    lines += _duplicates(page) + ([""] if page.duplicates else [])
    lines += footer(rows, page.excluded)
    return "\n".join(lines) + "\n"


def commits_line(counts: Counter[str]) -> str:
    """Where the runs' code came from (tag ``rlbench.git_commit``)."""
    parts = [f"`{c[:12]}{'+dirty' if c.endswith('+dirty') else ''}` ({n})" if c
             else f"not recorded ({n})" for c, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    return "- Runs made at commit: " + ", ".join(parts) + "."
