"""Safe checker for Countdown answers: parse an arithmetic expression, never execute it.

Model output is hostile input. This module never calls ``eval``/``exec``/``compile`` or
``ast.literal_eval``: a whitelist tokenizer accepts only ASCII digits ``0-9``, the operators
``+ - * /``, parentheses and spaces, and a recursive-descent parser evaluates the expression with
exact :class:`fractions.Fraction` arithmetic (so ``1/3*3 == 1`` exactly, with no float tolerance).

Hard bounds keep every call far below 100 ms whatever the input: at most ``MAX_CHARS``
characters, integer literals of at most ``MAX_DIGITS`` digits and parentheses nested at most
``MAX_DEPTH`` deep. Unicode digits such as ``'٣'`` or ``'３'`` are rejected (``str.isdigit`` and
``int()`` would accept them, so neither is used).

Unary minus (and unary plus) is not allowed: every Countdown number is positive, so a correct
answer never needs it, and ``-`` is always a binary operator. ``**`` is a parse error because an
operator must be followed by an operand.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

MAX_CHARS = 200
MAX_DIGITS = 6
MAX_DEPTH = 20

_DIGITS = frozenset("0123456789")
_OPERATORS = frozenset("+-*/")


@dataclass
class CheckResult:
    """The verdict on one expression.

    ``parsed``: the text is a well-formed expression (a division by zero still counts as parsed).
    ``numbers_ok``: its integer literals are exactly the multiset of the given numbers.
    ``correct``: ``numbers_ok`` and the exact value equals the target.
    ``value``: the exact value, or None when unparsed or on division by zero.
    ``reason``: a short human-readable explanation (``"ok"`` when correct).
    """

    parsed: bool
    numbers_ok: bool
    correct: bool
    value: Fraction | None
    reason: str


class _ParseError(Exception):
    pass


def _tokenize(text: str) -> list[str | int]:
    """Split into int literals and one-character operator/paren tokens; spaces are dropped."""
    tokens: list[str | int] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == " ":
            i += 1
        elif ch in _DIGITS:
            value, start = 0, i
            while i < n and text[i] in _DIGITS:
                if i - start >= MAX_DIGITS:
                    raise _ParseError(f"integer literal longer than {MAX_DIGITS} digits")
                value = value * 10 + (ord(text[i]) - 48)
                i += 1
            tokens.append(value)
        elif ch in _OPERATORS or ch in "()":
            tokens.append(ch)
            i += 1
        else:
            raise _ParseError(f"unexpected character {ch!r} at position {i}")
    return tokens


class _Parser:
    """expr := term (('+'|'-') term)* ; term := factor (('*'|'/') factor)* ;
    factor := INT | '(' expr ')'. Evaluates while parsing; ``None`` marks a division by zero."""

    def __init__(self, tokens: list[str | int]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.depth = 0
        self.literals: list[int] = []
        self.div_by_zero = False

    def _peek(self) -> str | int | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def parse(self) -> Fraction | None:
        if not self.tokens:
            raise _ParseError("empty expression")
        value = self._expr()
        if self.pos != len(self.tokens):
            raise _ParseError(f"unexpected token {self.tokens[self.pos]!r}")
        return value

    def _expr(self) -> Fraction | None:
        value = self._term()
        while self._peek() in ("+", "-"):
            op = self.tokens[self.pos]
            self.pos += 1
            rhs = self._term()
            if value is None or rhs is None:
                value = None
            else:
                value = value + rhs if op == "+" else value - rhs
        return value

    def _term(self) -> Fraction | None:
        value = self._factor()
        while self._peek() in ("*", "/"):
            op = self.tokens[self.pos]
            self.pos += 1
            rhs = self._factor()
            if value is None or rhs is None:
                value = None
            elif op == "*":
                value = value * rhs
            elif rhs == 0:
                self.div_by_zero = True
                value = None
            else:
                value = value / rhs
        return value

    def _factor(self) -> Fraction | None:
        tok = self._peek()
        if isinstance(tok, int):
            self.pos += 1
            self.literals.append(tok)
            return Fraction(tok)
        if tok == "(":
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise _ParseError(f"parentheses nested deeper than {MAX_DEPTH}")
            self.pos += 1
            value = self._expr()
            if self._peek() != ")":
                raise _ParseError("unbalanced parentheses")
            self.pos += 1
            self.depth -= 1
            return value
        if tok is None:
            raise _ParseError("expected an operand at end of expression")
        raise _ParseError(f"expected an operand, got {tok!r} (unary operators are not allowed)")


def check_expression(text: str, numbers: list[int], target: int) -> CheckResult:
    """Check that ``text`` is an arithmetic expression using every number of ``numbers`` exactly
    once whose exact value is ``target``. Never executes ``text``; always returns quickly."""
    if not isinstance(text, str):
        return CheckResult(False, False, False, None, "not a string")
    if len(text) > MAX_CHARS:
        return CheckResult(False, False, False, None, f"longer than {MAX_CHARS} characters")
    try:
        parser = _Parser(_tokenize(text))
        value = parser.parse()
    except _ParseError as exc:
        return CheckResult(False, False, False, None, str(exc))
    numbers_ok = Counter(parser.literals) == Counter(int(x) for x in numbers)
    if parser.div_by_zero:
        return CheckResult(True, numbers_ok, False, None, "division by zero")
    if not numbers_ok:
        reason = (
            f"numbers used {sorted(parser.literals)} are not exactly the given {sorted(numbers)}"
        )
        return CheckResult(True, False, False, value, reason)
    if value != target:
        return CheckResult(True, True, False, value, f"value {value} != target {target}")
    return CheckResult(True, True, True, value, "ok")
