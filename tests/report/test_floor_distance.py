"""benchmarks/floor_distance.py and the scripts it drives (arithmetic_floor.py, step_time.py) run
against today's Trainer: a change to the trainer's API that breaks a benchmark fails here, not
when someone next measures. The figures themselves are not asserted (they depend on the
machine); only that each is measured and printed as a multiple of its floor."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

from tests.helpers import FAST_PRETRAIN

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_step_is_timed_and_printed_as_a_multiple_of_its_floor(capsys, monkeypatch,
                                                                   model_cache, tiny_model_path):
    monkeypatch.setenv("RLBENCH_CACHE", str(model_cache))
    fd = _script("floor_distance")
    # the session's quickly warm-started model (tests/helpers.py), not the default's
    assert fd.main(["--runs", "1", "--skip-trl", "--skip-demo", "--steps", "2",
                    "--warmup", "0", *FAST_PRETRAIN]) == 0
    out = capsys.readouterr().out
    step = re.search(r"step +rlbench ([\d.]+) s .*\| floor ([\d.]+) s .*\| ([\d.]+)x the floor",
                     out)
    assert step, out
    ours, floor, multiple = map(float, step.groups())
    assert ours > 0 and floor > 0 and abs(multiple - ours / floor) < 0.01
