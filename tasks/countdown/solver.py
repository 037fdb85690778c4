"""Exhaustive Countdown solver and the generator of the tiny-testbed problems.

``solve`` finds an expression that uses every number exactly once and equals the target, with
exact arithmetic. It is used to write warm-start completions and to check that generated
problems are solvable. The answer is canonical: among all solutions it returns the one with the
fewest parentheses, then the shortest, then the lexicographically smallest string, so the same
input always gives the same string (whatever the order of ``numbers``).

Values are :class:`~fractions.Fraction` when ``/`` is allowed and plain ``int`` otherwise:
``+ - *`` keep integers integral, and an ``int`` equals and hashes as the same ``Fraction``, so
both give the same tables, in the same order, and the same answers; integers are several times
faster, which every run on the tiny testbed (``ops="+-*"``) pays when it writes its warm start.

The search memoises, per sub-multiset of the numbers, every reachable value together with its
cheapest expression for each "top operator class" (literal, ``+``/``-``, ``*``/``/``). Keeping
one expression per class is what makes the minimal-parentheses choice exact: whether a
sub-expression needs parentheses depends only on its class and on where it is placed.
At the top level the target is looked up instead of enumerated, so a 4-number problem costs a
few milliseconds.

``enumerate_tiny_problems`` lists every multiset of ``count`` numbers from 1..``max_number`` with
every positive integer target reachable from it; with the defaults that is 1,973 problems.
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction
from functools import lru_cache
from itertools import combinations_with_replacement

# top-operator classes of an expression
_ATOM, _ADD, _MUL = 0, 1, 2

# (parentheses, length, text): the cost order used to pick the canonical expression
_Entry = tuple[int, int, str]
_Value = Fraction | int
_Table = dict[_Value, dict[int, _Entry]]


def _wrap(entry: _Entry) -> _Entry:
    parens, length, text = entry
    return parens + 1, length + 2, f"({text})"


def _combine(op: str, a: _Entry, a_cls: int, b: _Entry, b_cls: int) -> _Entry:
    """Join two sub-expressions with ``op``, adding only the parentheses precedence requires."""
    if op in "*/" and a_cls == _ADD:
        a = _wrap(a)
    if (op == "-" and b_cls == _ADD) or (op == "*" and b_cls == _ADD) or (
        op == "/" and b_cls != _ATOM
    ):
        b = _wrap(b)
    return a[0] + b[0], a[1] + b[1] + 1, f"{a[2]}{op}{b[2]}"


def _apply(op: str, a: _Value, b: _Value) -> _Value | None:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a / b if b != 0 else None


def _splits(nums: tuple[int, ...]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every ordered split of the multiset ``nums`` into two non-empty sub-multisets."""
    n = len(nums)
    seen: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    out = []
    for mask in range(1, (1 << n) - 1):
        left = tuple(nums[i] for i in range(n) if mask >> i & 1)
        right = tuple(nums[i] for i in range(n) if not mask >> i & 1)
        if (left, right) not in seen:
            seen.add((left, right))
            out.append((left, right))
    return out


def _add_entry(table: _Table, value: _Value, cls: int, entry: _Entry) -> None:
    slot = table.setdefault(value, {})
    best = slot.get(cls)
    if best is None or entry < best:
        slot[cls] = entry


@lru_cache(maxsize=8192)
def _table(nums: tuple[int, ...], ops: str) -> _Table:
    """All values reachable from the sorted multiset ``nums`` using each number once."""
    if len(nums) == 1:
        text = str(nums[0])
        return {_number(nums[0], ops): {_ATOM: (0, len(text), text)}}
    table: _Table = {}
    for left, right in _splits(nums):
        lt, rt = _table(left, ops), _table(right, ops)
        for a, a_entries in lt.items():
            for b, b_entries in rt.items():
                for op in ops:
                    value = _apply(op, a, b)
                    if value is None:
                        continue
                    cls = _ADD if op in "+-" else _MUL
                    for a_cls, a_entry in a_entries.items():
                        for b_cls, b_entry in b_entries.items():
                            entry = _combine(op, a_entry, a_cls, b_entry, b_cls)
                            _add_entry(table, value, cls, entry)
    return table


def _number(n: int, ops: str) -> _Value:
    """``n`` as the solver's value: a Fraction only where division can leave the integers."""
    return Fraction(n) if "/" in ops else n


def _needed_right(op: str, a: _Value, target: _Value) -> _Value | None:
    """The b with ``a op b == target`` (None when no such b exists)."""
    if op == "+":
        return target - a
    if op == "-":
        return a - target
    if op == "*":
        if a == 0:
            return None  # 0*b == target only if target == 0; then any b works (handled below)
        if isinstance(target, int) and isinstance(a, int):  # no "/": b must be an integer
            return target // a if target % a == 0 else None
        return target / a
    if target == 0:
        return None  # a/b == 0 needs a == 0: handled below
    return a / target


def _check_ops(ops: str) -> str:
    bad = set(ops) - set("+-*/")
    if bad or not ops:
        raise ValueError(f"ops must be a non-empty subset of '+-*/', got {ops!r}")
    return "".join(op for op in "+-*/" if op in ops)  # canonical order for the memo key


def solve(numbers: Iterable[int], target: int, ops: str = "+-*/") -> str | None:
    """A canonical expression using every number exactly once that equals ``target``, or None.

    Canonical = fewest parentheses, then shortest, then lexicographically smallest; no spaces.
    """
    ops = _check_ops(ops)
    nums = tuple(sorted(int(x) for x in numbers))
    if not nums:
        return None
    goal = _number(target, ops)
    if len(nums) == 1:
        return str(nums[0]) if nums[0] == goal else None
    best: _Entry | None = None
    for left, right in _splits(nums):
        lt, rt = _table(left, ops), _table(right, ops)
        for a, a_entries in lt.items():
            for op in ops:
                needed = _needed_right(op, a, goal)
                if needed is not None:
                    candidates = [needed] if needed in rt else []
                elif (op == "*" and a == 0 and goal == 0) or (op == "/" and a == 0 == goal):
                    candidates = [b for b in rt if op == "*" or b != 0]
                else:
                    candidates = []
                for b in candidates:
                    if _apply(op, a, b) != goal:
                        continue
                    for a_cls, a_entry in a_entries.items():
                        for b_cls, b_entry in rt[b].items():
                            entry = _combine(op, a_entry, a_cls, b_entry, b_cls)
                            if best is None or entry < best:
                                best = entry
    return best[2] if best is not None else None


def reachable_values(numbers: Iterable[int], ops: str = "+-*/") -> set[_Value]:
    """Every exact value an expression using each of ``numbers`` exactly once can take."""
    ops = _check_ops(ops)
    nums = tuple(sorted(int(x) for x in numbers))
    return set(_table(nums, ops)) if nums else set()


def enumerate_tiny_problems(
    count: int = 3, max_number: int = 9, ops: str = "+-*"
) -> list[tuple[tuple[int, ...], int]]:
    """Every (sorted numbers, target) with ``count`` numbers from 1..``max_number`` (repeats
    allowed) and a positive integer target reachable using each number exactly once.

    Sorted by numbers, then target, so the list is deterministic.
    """
    if count < 1 or max_number < 1:
        raise ValueError(f"count and max_number must be >= 1, got {count}, {max_number}")
    problems: list[tuple[tuple[int, ...], int]] = []
    for nums in combinations_with_replacement(range(1, max_number + 1), count):
        targets = sorted(
            int(v) for v in reachable_values(nums, ops) if v > 0 and v.denominator == 1
        )
        problems.extend((nums, t) for t in targets)
    return problems
