"""The tiny code testbed: infer a one-line integer function from three input/output examples.

Prompt ``"f(10)=31 f(2)=7 f(5)=16\\n"``, reference completion ``"def f(x): return x*3+1"``.
Functions come from five small families (``x*a+b``, ``x*a``, ``x+b``, ``x*x+b``, ``x*a-b``: 171
distinct functions); a problem is a function shown at 10 and two more inputs from 0..9
(171 x 45 = 7,695 problems). f(10) spells ``x*a+b``, ``x*a``, ``x+b`` and ``x*x+b`` almost
digit by digit (31, 30, 13, 103), while ``x*a-b`` (f(10) = 10a - b) needs arithmetic: a tiny
model starts with part of it right and has room to learn the rest. Its tests are the shown
inputs plus ``hidden`` unseen inputs from 0..12 (so a lookup table of the examples fails), each
``assert f(x) == y`` graded through the same sandbox as the real benchmarks. Any program that
computes the right values passes, not only the reference form.
"""

from __future__ import annotations

import itertools
import random

from harness.types import Example

HEADER = "def f(x): return "


def functions() -> list[str]:
    """Every expression of the tiny families (deduplicated by their values on 0..12)."""
    exprs = [f"x*{a}+{b}" for a in range(2, 10) for b in range(1, 10)]
    exprs += [f"x*{a}-{b}" for a in range(2, 10) for b in range(1, 10)]
    exprs += [f"x*x+{b}" for b in range(10)]
    exprs += [f"x*{a}" for a in range(2, 10)]
    exprs += [f"x+{b}" for b in range(1, 10)]
    seen: dict[tuple[int, ...], str] = {}
    for e in exprs:
        seen.setdefault(tuple(eval(e, {"x": x}) for x in range(13)), e)  # trusted, ours
    return sorted(seen.values())


def problems(hidden: int, seed: int) -> list[Example]:
    """All (function, shown-inputs) problems, in a deterministic order (``seed`` picks the
    hidden test inputs of each)."""
    rng = random.Random(seed)
    out = []
    for expr in functions():
        fn = eval(f"lambda x: {expr}")  # trusted: our own generated expression
        for pair in itertools.combinations(range(10), 2):
            shown = (10, *pair)  # f(10) spells a*x+b as the digits "ab"; the others vary
            rest = [x for x in range(13) if x not in shown]
            tests = [*shown, *rng.sample(rest, hidden)]
            prompt = " ".join(f"f({x})={fn(x)}" for x in shown) + "\n"
            out.append(Example(
                id=f"tiny/{expr}/{''.join(map(str, shown))}", prompt=prompt,
                answer={"kind": "functional", "preamble": "",
                        "units": [f"assert f({x}) == {fn(x)}\n" for x in tests]},
                meta={"dataset": "tiny", "reference": HEADER + expr, "expr": expr},
            ))
    return out
