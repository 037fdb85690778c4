"""benchmarks/floor_distance.py and the scripts it drives (arithmetic_floor.py, step_time.py) run
against today's Trainer: a change to the trainer's API that breaks a benchmark fails here, not
when someone next measures. The figures themselves are not asserted (they depend on the
machine); only that each is measured and printed as a multiple of its floor."""

from __future__ import annotations

import re

import pytest

from tests.helpers import FAST_PRETRAIN, load_benchmark


@pytest.mark.slow
def test_the_step_is_timed_and_printed_as_a_multiple_of_its_floor(capsys, monkeypatch,
                                                                   model_cache, tiny_model_path):
    monkeypatch.setenv("RLBENCH_CACHE", str(model_cache))
    fd = load_benchmark("floor_distance")
    # the session's quickly warm-started model (tests/helpers.py), not the default's
    assert fd.main(["--runs", "1", "--skip-trl", "--skip-demo", "--steps", "2",
                    "--warmup", "0", *FAST_PRETRAIN]) == 0
    out = capsys.readouterr().out
    step = re.search(r"step +rlbench ([\d.]+) s .*\| floor ([\d.]+) s .*\| ([\d.]+)x the floor",
                     out)
    assert step, out
    ours, floor, multiple = map(float, step.groups())
    assert ours > 0 and floor > 0 and abs(multiple - ours / floor) < 0.01
