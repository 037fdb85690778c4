"""Mutation testing of the modules whose behaviour defines a result (mutmut 3).

    pip install -e ".[mutation]"
    python benchmarks/mutation.py --list           # the scoped modules, their tests, their scope
    python benchmarks/mutation.py --module harness/evaluation.py             # "after" column
    python benchmarks/mutation.py --module harness/evaluation.py --baseline  # "before" column
    python benchmarks/mutation.py --all            # every scoped module, one after another
    python benchmarks/mutation.py --table          # benchmarks/README.md's table, last runs

Not part of CI: a module takes one to seventeen minutes on a 2-core machine.

For each module the script copies the checkout's packages, ``conf/``, ``tests/`` and
``pyproject.toml`` into ``.mutation/<module>[-baseline]/`` (a snapshot, so edits made while it
runs do not leak in), writes mutmut's ``setup.cfg`` there (only that module mutated, only the
test files that exercise it run), runs ``mutmut run`` and reads the verdicts back. It prints,
and writes to ``.mutation/results/<module>.json`` (``results-baseline/`` with ``--baseline``,
which runs only the test files that predate the mutation run, the first list of each module in
``MODULES``):

- killed: mutants a test failed on; a timeout (tests 3x slower than on the clean code) is
  rerun alone without mutmut's limit (``recheck_timeouts``: load beside the run makes unchanged
  mutants that slow) and counts as killed only if a test then fails, or it hangs again;
- survived: mutants every selected test passed on; a mutant in a function none of the selected
  tests call ("no tests") is counted as survived too (nothing guards it);
- kill rate = killed / (killed + survived), i.e. over every mutant of the scope;
- equivalent: survivors listed in ``benchmarks/mutation_survivors.md`` (a backquoted mutant
  name), i.e. mutants that cannot change behaviour; every other survivor is printed with its
  diff as "unexplained" and should get a test that names the behaviour it guards.

Mutant names (``harness.evaluation.x_pass_at_k__mutmut_7``) are mutmut's: the function and the
ordinal of the mutation inside it, so an edit to a function renumbers its mutants; rerun and
recheck the survivors list when a module changes.

Inspect a module's mutants afterwards with mutmut itself:
    cd .mutation/harness_evaluation && mutmut show harness.evaluation.x_pass_at_k__mutmut_7
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".mutation"
SURVIVORS = ROOT / "benchmarks" / "mutation_survivors.md"
PACKAGES = ["harness", "algorithms", "tasks", "lantern"]
ALSO_COPY = ["conf", "tests", "pyproject.toml"]
# what a module's tests read besides the code: the ledger's tests read the committed claim files,
# boards and ledger, and the rebuild script
EXTRA_COPY: dict[str, list[str]] = {
    "harness/report/claims_ledger.py": ["docs", "leaderboards", "benchmarks"]}

# module -> (test files that exercised it before the mutation run existed, test files added to
# kill its survivors, optional mutant-name globs restricting the run to the functions that define
# behaviour). --baseline runs only the first list: the "before" column of benchmarks/README.md.
MODULES: dict[str, tuple[list[str], list[str], list[str]]] = {
    # evaluation: pass@k, maj@k, sampling settings
    "harness/evaluation.py": (
        ["test_evaluation.py"], ["test_evaluation_metrics.py"], []),
    # statistics and aggregates
    "harness/report/stats.py": (
        ["test_stats.py", "test_stats_coverage.py"], ["test_stats_edges.py"], []),
    # the score and its aggregates; not the page (render, _per_task, _iv, ...) nor the plot
    "harness/report/aggregate.py": (
        ["test_suite_aggregate.py"], ["test_suite_aggregate_edges.py"],
        ["harness.report.aggregate.xǁTaskScoresǁ*", "harness.report.aggregate.x__seed_key*",
         "harness.report.aggregate.x__seeded*", "harness.report.aggregate.x_aggregate__*"]),
    # advantages and losses
    "harness/groups.py": (
        ["test_advantages.py"], ["test_group_statistics.py"], []),
    "harness/policy_loss.py": (
        ["test_policy_loss.py", "test_aggregation.py", "test_cispo_gppo.py"],
        ["test_policy_loss_edges.py"], []),
    "harness/algorithm.py": (
        ["test_aggregation.py", "test_kl_entropy_terms.py", "test_policy_loss.py",
         "test_advantages.py"], ["test_algorithm_base.py"], []),
    "algorithms/grpo.py": (
        ["test_advantages.py", "test_policy_loss.py"], ["test_advantage_estimators.py"], []),
    "algorithms/dapo.py": (
        ["test_dapo.py"], ["test_advantage_estimators.py"], []),
    "algorithms/rloo.py": (
        ["test_advantages.py"], ["test_advantage_estimators.py"], []),
    "algorithms/reinforce_pp.py": (
        ["test_advantages.py"], ["test_advantage_estimators.py"], []),
    "algorithms/cispo.py": (
        ["test_cispo_gppo.py"], ["test_advantage_estimators.py"], []),
    "algorithms/gppo.py": (
        ["test_cispo_gppo.py"], ["test_advantage_estimators.py"], []),
    # verifiers and graders
    "harness/verifiers.py": (
        ["test_custom_task.py"], ["test_verifiers.py"], []),
    # the grading rules, the cache and the counts; not the worker-process plumbing (_run,
    # _replace, _Proc), whose mutants hang or kill workers and which test_math_grading.py covers
    "harness/mathgrade/grading.py": (
        ["test_math_grading.py"], ["test_math_grading_edges.py"],
        ["harness.mathgrade.grading.xǁMathGraderǁ__init__*",
         "harness.mathgrade.grading.xǁMathGraderǁgrade*",
         "harness.mathgrade.grading.xǁMathGraderǁ_remember*",
         "harness.mathgrade.grading.xǁMathGraderǁ_limit*",
         "harness.mathgrade.grading.x_answer_reward*",
         "harness.mathgrade.grading.x_grading_stats*"]),
    "tasks/countdown/verifier.py": (
        ["test_countdown_verifier.py"], ["test_countdown_verifier_edges.py"], []),
    # the grading rules (asserts as units, output comparison, credit); not the sandbox plumbing
    # (CodeGrader's fork-server sessions), which tests/sandbox/test_sandbox*.py cover end to end
    "tasks/code/grading.py": (
        ["test_code_grading_logic.py"], ["test_code_grading_edges.py"],
        ["tasks.code.grading.x_split_asserts*", "tasks.code.grading.x_asserts_nothing*",
         "tasks.code.grading.x_called_names*", "tasks.code.grading.x_outputs_match*",
         "tasks.code.grading.xǁGradeResultǁ*"]),
    # checkpoint/resume and sweep cells
    "harness/checkpoint.py": (
        ["test_tracking_extras.py"], ["test_checkpoint_files.py"], []),
    "harness/cell_plan.py": (
        ["test_claims.py"], ["test_cell_plan.py"], []),
    # the KV-cache decode path
    "harness/backends/kv_decode.py": (
        ["test_kv_decode.py", "test_shared_prefix.py", "test_vlm_fast_path.py"],
        ["test_shared_prefix_config.py"], []),
    # the confirmatory analysis: the seed-blocked model, max-|t| adjusted p-values, the MDE and
    # the seeds a plan needs, identical rows
    "harness/report/analysis.py": (
        ["test_board_analysis.py"], ["test_board_analysis_edges.py"], []),
    # the claims ledger's verdicts (rules 2-5: the claimed effect, which row decides, controls,
    # shown / not shown / inconclusive), not the reading of files or the page it writes
    "harness/report/claims_ledger.py": (
        ["test_claims_ledger.py"], ["test_claims_ledger_rules.py"],
        [f"harness.report.claims_ledger.x_{name}__*" for name in (
            "claimed_effect", "read_row", "read_curve", "read_as", "_title", "_num",
            "row_result", "curve_result", "controls", "_aggregate", "judge_claim")]),
    # exported runs: the metric rows a board and an import read and write in bulk
    "harness/report/metric_rows.py": (
        ["test_metric_rows.py"], [], []),
    # compatibility rules
    "harness/compat.py": (
        ["test_compat.py"], ["test_compat_rules.py"], []),
}


# Tests that cannot run twice in one process (mutmut runs the selected tests in-process once to
# map tests to functions, then again as the clean run): left out of the mutation run, with why.
DESELECT: dict[str, list[str]] = {
    # mutates its own parametrize argument (finals["grpo"]["9"] = ...), so the second run in the
    # same process sees a task with seed noise and the pytest.raises fails
    "harness/report/aggregate.py": [
        "tests/report/test_suite_aggregate.py::test_a_task_without_seed_noise_is_refused_naming_it",
        # end-to-end boards (MLflow store, 10-25 s each on the 2-core machine): too slow to run
        # per mutant; they exercise task_scores/render, which are outside this module's scope
        "tests/report/test_suite_aggregate.py"
        "::test_suite_board_writes_the_aggregate_beside_per_task_boards",
        "tests/report/test_suite_aggregate.py::test_duplicated_cell_is_refused_naming_the_runs"],
    # rebuilds every committed board in a clone (~20 s a run); it exercises the ledger's
    # writing, outside the module's scope, and the verdict rules are read by the other tests
    "harness/report/claims_ledger.py": [
        "tests/report/test_claims_ledger.py::test_rebuild_boards_reports_a_stale_ledger"],
}


def slug(module: str) -> str:
    return module.removesuffix(".py").replace("/", "_")


def dotted(module: str) -> str:
    return module.removesuffix(".py").replace("/", ".")


def equivalents() -> set[str]:
    if not SURVIVORS.exists():
        return set()
    return set(re.findall(r"`([\w.ǁ]+__mutmut_\d+)`", SURVIVORS.read_text()))


def prepare(module: str, tests: list[str], baseline: bool) -> Path:
    ws = WORK / (slug(module) + ("-baseline" if baseline else ""))
    if ws.exists():
        shutil.rmtree(ws)
    ws.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    also = ALSO_COPY + EXTRA_COPY.get(module, [])
    for name in PACKAGES + also:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, ws / name, ignore=ignore)
        elif src.exists():
            shutil.copy2(src, ws / name)
    # test files are named, not placed: tests/<group>/<name> wherever the layout puts them
    present = [str(p.relative_to(ROOT)) for t in tests for p in sorted((ROOT / "tests").rglob(t))]
    cfg = [
        "[mutmut]",
        "source_paths =",
        *(f"    {p}" for p in PACKAGES),
        f"only_mutate = {module}",
        "also_copy =",
        *(f"    {p}" for p in also),
        "pytest_add_cli_args_test_selection =",
        *(f"    {t}" for t in present),
        "pytest_add_cli_args =",
        "    -p",
        "    no:cacheprovider",
        "    -m",
        "    not gpu",
        *(f"    --deselect={t}" for t in DESELECT.get(module, [])),
        # a mutant whose tests run 3x longer than on the clean code is a timeout (mutmut's
        # default, 15x, lets one infinite loop hold a worker for ten minutes)
        "timeout_multiplier = 3",
        "",
    ]
    (ws / "setup.cfg").write_text("\n".join(cfg))
    return ws


def mutmut(ws: Path, *args: str, capture: bool = False) -> subprocess.CompletedProcess:
    exe = shutil.which("mutmut") or "mutmut"
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([exe, *args], cwd=ws, env=env, text=True,
                          capture_output=capture, check=False)


READ_BACK = """
import json, sys
from pathlib import Path
from mutmut.mutation.data import SourceFileMutationData
from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.stats import status_by_exit_code
module = sys.argv[1]
m = SourceFileMutationData(path=Path(module))
m.load()
verdicts = {k: status_by_exit_code[v] for k, v in m.exit_code_by_key.items()}
# timeouts too: a rechecked timeout can turn out a survivor (recheck_timeouts)
diffs = {k: get_diff_for_mutant(k, path=module) for k, s in verdicts.items() if s != "killed"}
print(json.dumps({"verdicts": verdicts, "diffs": diffs}))
"""


NAMES = """
import json, sys
from mutmut.mutation.file_mutation import mutate_file_contents
module, dotted = sys.argv[1], sys.argv[2]
mf = mutate_file_contents(module, open(module).read())
print(json.dumps([f"{dotted}.{n}" for n in mf.mutant_names]))
"""


def sample_names(ws: Path, module: str, k: int) -> list[str]:
    """``k`` of the module's mutants, the same ones on every run (seeded)."""
    out = subprocess.run([sys.executable, "-c", NAMES, module, dotted(module)], cwd=ws,
                         text=True, capture_output=True, check=True).stdout
    names = json.loads(out)
    return sorted(random.Random(0).sample(names, min(k, len(names))))


# a timed-out mutant is rerun alone with at most this long for its tests (see recheck_timeouts)
RECHECK_LIMIT_S = 900


def recheck_timeouts(ws: Path, names: list[str]) -> dict[str, str]:
    """The verdict of each timed-out mutant, rerun alone. mutmut calls a mutant whose tests run
    over ``timeout_multiplier`` times the clean run's time a timeout, and a timeout counts as
    killed; on a loaded machine (a sweep beside it) a mutant that changes nothing can be that
    slow, and was counted as killed. Each is rerun here with the module's selected tests and
    pytest arguments (its ``setup.cfg``) and ``MUTANT_UNDER_TEST`` set (mutmut's switch): every
    test passing is ``survived``, any failure or error ``killed``, over
    :data:`RECHECK_LIMIT_S` again ``timeout`` (a hang, killed)."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(ws / "setup.cfg")
    def lines(key: str) -> list[str]:  # one argument per line, as prepare writes them
        return [a.strip() for a in cfg["mutmut"][key].splitlines() if a.strip()]

    args, tests = lines("pytest_add_cli_args"), lines("pytest_add_cli_args_test_selection")
    out = {}
    for name in names:
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", MUTANT_UNDER_TEST=name)
        try:
            proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", *args, *tests],
                                  cwd=ws / "mutants", env=env, capture_output=True, text=True,
                                  timeout=RECHECK_LIMIT_S)
        except subprocess.TimeoutExpired:
            out[name] = "timeout"
        else:
            out[name] = "survived" if proc.returncode == 0 else "killed"
        print(f"recheck {name}: {out[name]}", flush=True)
    return out


def run_module(module: str, jobs: int, baseline: bool, sample: int = 0,
               resume: bool = False) -> dict:
    tests, added, globs = MODULES[module]
    ws = WORK / (slug(module) + ("-baseline" if baseline else ""))
    if not (resume and (ws / "mutants").is_dir()):
        ws = prepare(module, tests if baseline else tests + added, baseline)
    if sample:
        globs = sample_names(ws, module, sample)
    t0 = time.time()
    proc = mutmut(ws, "run", "--max-children", str(jobs), *globs)
    wall = time.time() - t0
    back = subprocess.run([sys.executable, "-c", READ_BACK, module], cwd=ws, text=True,
                          capture_output=True, check=True)
    data = json.loads(back.stdout)
    verdicts, diffs = data["verdicts"], data["diffs"]
    if globs:
        verdicts = {k: v for k, v in verdicts.items() if any(fnmatch(k, g) for g in globs)}
    timeouts = sorted(k for k, v in verdicts.items() if v == "timeout")
    rechecked = recheck_timeouts(ws, timeouts)
    verdicts.update(rechecked)
    counts: dict[str, int] = {}
    for status in verdicts.values():
        counts[status] = counts.get(status, 0) + 1
    killed = counts.get("killed", 0) + counts.get("timeout", 0) + counts.get("segfault", 0)
    surv = sorted(k for k, s in verdicts.items()
                  if s in ("survived", "no tests", "suspicious", "not checked"))
    equiv = equivalents()
    eq = [k for k in surv if k in equiv]
    unexplained = [k for k in surv if k not in equiv]
    total = killed + len(surv)
    result = {
        "module": module,
        "tests": "baseline" if baseline else "all",
        "sample": sample or None,
        "mutmut_exit": proc.returncode,
        "wall_s": round(wall, 1),
        "statuses": counts,
        "timeouts_rechecked": rechecked,
        "mutants": total,
        "killed": killed,
        "survived": len(surv),
        "kill_rate": round(killed / total, 4) if total else None,
        "equivalent": eq,
        "unexplained": unexplained,
    }
    out = WORK / ("results-baseline" if baseline else "results")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{slug(module)}.json").write_text(json.dumps(result, indent=1))
    (out / f"{slug(module)}.survivors.txt").write_text(
        "\n\n".join(f"# {k}: {verdicts[k]}\n{diffs.get(k, '')}" for k in unexplained))
    return result


def table() -> str:
    """The before/after table of benchmarks/README.md from the last runs' result files."""
    def load(kind: str, module: str) -> dict | None:
        f = WORK / kind / f"{slug(module)}.json"
        return json.loads(f.read_text()) if f.exists() else None

    def rate(r: dict | None) -> str:
        return f"{100 * r['kill_rate']:.1f}%" if r and r["kill_rate"] is not None else "-"

    equiv = equivalents()

    def split(r: dict) -> tuple[int, int]:  # (equivalent, unexplained) against the list now
        surv = r["equivalent"] + r["unexplained"]
        eq = sum(k in equiv for k in surv)
        return eq, len(surv) - eq

    def net(r: dict | None) -> str:  # killed / (mutants - equivalent)
        if not r:
            return "-"
        real = r["mutants"] - split(r)[0]
        return f"{100 * r['killed'] / real:.1f}%" if real else "-"

    lines = ["| module | mutants | killed before | killed after | rate before | rate after "
             "| equivalent | rate after, equivalents left out | unexplained |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for module in MODULES:
        b, a = load("results-baseline", module), load("results", module)
        if b is None and a is None:
            continue
        n = (a or b)["mutants"]
        if (a or b).get("sample"):
            n = f"{n} (sample)"
        lines.append(f"| `{module}` | {n} | {b['killed'] if b else '-'} | "
                     f"{a['killed'] if a else '-'} | {rate(b)} | {rate(a)} | "
                     f"{split(a)[0] if a else '-'} | {net(a)} | {split(a)[1] if a else '-'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--module", action="append", default=[],
                    help="a module path, e.g. harness/evaluation.py (repeatable)")
    ap.add_argument("--all", action="store_true", help="every scoped module")
    ap.add_argument("--list", action="store_true", help="the scoped modules and their tests")
    ap.add_argument("--table", action="store_true",
                    help="print the before/after table from the last runs (no run)")
    ap.add_argument("--baseline", action="store_true",
                    help="only the tests that predate the mutation run (the 'before' column)")
    ap.add_argument("--jobs", type=int, default=2, help="mutants tested at once (default 2)")
    ap.add_argument("--resume", action="store_true",
                    help="continue an interrupted run in its workspace (mutmut keeps the verdicts "
                         "it has; only mutants without one are tested)")
    ap.add_argument("--sample", type=int, default=0, metavar="N",
                    help="test only N mutants of each module, the same N on every run "
                         "(seeded), for modules whose tests are too slow to run per mutant")
    args = ap.parse_args(argv)
    if args.list:
        for m, (tests, added, globs) in MODULES.items():
            only = f"  [only {' '.join(globs)}]" if globs else ""
            print(f"{m}: {' '.join(tests + added)}{only}")
        return 0
    if args.table:
        print(table())
        return 0
    modules = list(MODULES) if args.all else args.module
    unknown = [m for m in modules if m not in MODULES]
    if unknown:
        ap.error(f"unknown module(s) {unknown}; see --list")
    if not modules:
        ap.error("give --module, --all, --list or --table")
    rows = [run_module(m, args.jobs, args.baseline, args.sample, args.resume) for m in modules]
    print(f"\n{'module':34} {'mutants':>7} {'killed':>6} {'rate':>6} {'equiv':>5} "
          f"{'unexpl':>6} {'wall':>6}")
    for r in rows:
        rate = f"{100 * r['kill_rate']:.1f}%" if r["kill_rate"] is not None else "-"
        print(f"{r['module']:34} {r['mutants']:7} {r['killed']:6} {rate:>6} "
              f"{len(r['equivalent']):5} {len(r['unexplained']):6} {r['wall_s']:5.0f}s")
        for k in r["unexplained"]:
            print(f"    unexplained survivor: {k}")
    print(f"\nsurvivor diffs: {WORK}/results[-baseline]/<module>.survivors.txt")
    return 0 if all(r["mutmut_exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
