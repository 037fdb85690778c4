"""``rlbench power`` (issue 31): seeds needed to detect an effect, planned from a committed
board's runs; bad input is one line and exit 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PILOT = ["--runs", "leaderboards/countdown-baselines", "--experiment", "countdown_baselines"]


@pytest.fixture
def power(rlbench_in_process):
    """``rlbench power ARGS`` from the repository root (in this process: tests/conftest.py)."""
    return lambda *args: rlbench_in_process("power", *args, cwd=ROOT)


@pytest.mark.slow
def test_power_plans_seeds_from_a_pilot_board(power):
    done = power(*PILOT, "--delta", "0.03", "--delta", "0.3")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    sd = float(re.search(r"residual SD ([0-9.]+)", out).group(1))
    pilot_seeds = int(re.search(r"\(\d+ df, (\d+) seeds\)", out).group(1))
    mde = float(re.search(r"MDE at the pilot's \d+ seeds: ([0-9.]+)", out).group(1))
    assert sd > 0 and mde > 0
    by_n = dict(re.findall(r"(\d+): ([0-9.]+)", out.split("MDE by seeds per row:")[1]
                           .splitlines()[0]))
    assert float(by_n["3"]) > float(by_n["10"]) > float(by_n["30"])  # more seeds, smaller MDE
    need_small = int(re.search(r"to detect 0\.03: (\d+) seeds", out).group(1))
    need_large = int(re.search(r"to detect 0\.3: (\d+) seeds", out).group(1))
    assert need_large < need_small  # a larger effect needs fewer seeds
    if mde <= 0.3:  # the pilot already detects 0.3: no more seeds than it has
        assert need_large <= pilot_seeds


@pytest.mark.slow
@pytest.mark.parametrize("args, needle", [
    (["--delta", "0"], "--delta must be > 0"),
    (["--delta", "-0.1"], "--delta must be > 0"),
])
def test_bad_power_input_is_one_line_and_exit_2(args, needle, power):
    done = power(*PILOT, *args)
    assert done.returncode == 2
    assert needle in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_an_unknown_pilot_experiment_is_named(tmp_path, power):
    done = power("--tracking-uri", f"sqlite:///{tmp_path / 'empty.db'}", "--experiment",
                  "nope", "--delta", "0.02")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "'nope'" in done.stderr
