"""The tiny MATH testbed: short problems with ``\\boxed{}`` answers that a 0.8 M-parameter
character-level model can learn on a CPU, graded through the same extraction and math-verify
worker path as the real eval sets.

Two families (every problem is enumerated, so the held-out split is fixed and exact):

* ``linear`` - ``Solve 3x+5=17`` with a in 1..6, b in -6..6 (b != 0), c in 0..12 (936
  problems); reference ``3x=12, x=\\boxed{4}``. Most answers are fractions
  (``4x=9, x=\\boxed{\\frac{9}{4}}``, ``x=\\boxed{-\\frac{9}{4}}``); math-verify also accepts an
  unreduced ``\\frac{12}{8}`` or a decimal ``2.25``, so the model is not held to one form.
* ``arith`` - ``Compute 5*6-9`` (``a*b+c``, ``a*b-c``, ``c+a*b``, ``c-a*b`` with a in 1..6, b in
  2..6, c in 1..9: 1,080 problems); reference ``5*6=30, \\boxed{21}`` (the product first, as
  precedence asks).

The prompt is the problem and a newline; the response is the short derivation and the boxed
answer.
"""

from __future__ import annotations

from fractions import Fraction

from harness.types import Example

FAMILIES = ("linear", "arith")


def latex(value: Fraction) -> str:
    """An exact value in MATH's answer style: ``4``, ``-3``, ``\\frac{9}{4}``, ``-\\frac{9}{4}``."""
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def _signed(n: int) -> str:
    return f"+{n}" if n >= 0 else str(n)


def linear_problems() -> list[Example]:
    out = []
    for a in range(1, 7):
        for b in (*range(-6, 0), *range(1, 7)):
            for c in range(13):
                lhs = f"{'' if a == 1 else a}x{_signed(b)}"
                x = Fraction(c - b, a)
                step = f"{'' if a == 1 else a}x={c - b}"
                out.append(Example(
                    id=f"tiny-linear/{a}/{b}/{c}", prompt=f"Solve {lhs}={c}\n",
                    answer={"gold": latex(x)},
                    meta={"family": "linear", "reference": f"{step}, x=\\boxed{{{latex(x)}}}"},
                ))
    return out


def arith_problems() -> list[Example]:
    out = []
    for form in ("{a}*{b}+{c}", "{a}*{b}-{c}", "{c}+{a}*{b}", "{c}-{a}*{b}"):
        for a in range(1, 7):
            for b in range(2, 7):
                for c in range(1, 10):
                    expr = form.format(a=a, b=b, c=c)
                    p = a * b
                    value = p + c if "+" in expr else (p - c if expr.startswith(f"{a}*") else c - p)
                    out.append(Example(
                        id=f"tiny-arith/{expr}", prompt=f"Compute {expr}\n",
                        answer={"gold": str(value)},
                        meta={"family": "arith", "reference": f"{a}*{b}={p}, \\boxed{{{value}}}"},
                    ))
    return out


def problems() -> dict[str, list[Example]]:
    return {"linear": linear_problems(), "arith": arith_problems()}
