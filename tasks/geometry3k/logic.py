"""Inter-GPS logic forms: a small parser and the diagram facts the renderer draws.

A logic form is a predicate term such as ``Equals(LengthOf(Line(A, B)), 12)``,
``Equals(MeasureOf(Angle(A, B, C)), 60)``, ``PointLiesOnCircle(C, Circle(O, radius_0_0))`` or
``Perpendicular(Line(B, D), Line(D, C))``. :func:`parse` turns one into a tree of
``(head, [args])`` tuples with string leaves; it is a bounded single pass over annotation text
(no ``eval``). :func:`facts` reads what a diagram states from one annotation record:
lengths and angle measures with their labels, arcs, equal segments, right angles, and which
points lie on which lines and circles.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Term = str | tuple[str, list["Term"]]
_MAX_LEN = 2000


def parse(text: str) -> Term:
    """The term tree of one logic form; a malformed form raises ``ValueError``."""
    text = text.strip()
    if len(text) > _MAX_LEN:
        raise ValueError("logic form too long")
    term, end = _term(text, 0)
    if text[end:].strip():
        raise ValueError(f"trailing text in logic form {text!r}")
    return term


def _term(s: str, i: int) -> tuple[Term, int]:
    """Parse the term starting at ``s[i]``: ``Head(arg, ...)`` or a leaf up to ``,`` / ``)``.
    A leaf keeps its inner brackets (``\\frac{1}{2}x``)."""
    j = i
    depth = 0
    while j < len(s):
        ch = s[j]
        if ch == "(" and depth == 0 and s[i:j].strip().isidentifier():
            head = s[i:j].strip()
            args: list[Term] = []
            j += 1
            while True:
                while j < len(s) and s[j] == " ":
                    j += 1
                if j < len(s) and s[j] == ")":
                    return (head, args), j + 1
                arg, j = _term(s, j)
                args.append(arg)
                while j < len(s) and s[j] == " ":
                    j += 1
                if j >= len(s):
                    raise ValueError(f"unclosed '(' in {s!r}")
                if s[j] == ",":
                    j += 1
                elif s[j] == ")":
                    return (head, args), j + 1
                else:
                    raise ValueError(f"unexpected {s[j]!r} in {s!r}")
        if ch in "({":
            depth += 1
        elif ch in ")}":
            if depth == 0:
                break
            depth -= 1
        elif ch == "," and depth == 0:
            break
        j += 1
    return s[i:j].strip(), j


def head(term: Term) -> str:
    return term[0] if isinstance(term, tuple) else ""


def args(term: Term) -> list[Term]:
    return term[1] if isinstance(term, tuple) else []


def names(term: Term) -> list[str]:
    """The point names of ``Line(A, B)`` / ``Angle(A, B, C)`` / ``Arc(A, B)`` (leaves only)."""
    return [a for a in args(term) if isinstance(a, str)]


@dataclass
class Facts:
    """What one diagram annotation states, in drawable form."""

    lengths: list[tuple[str, str, str]] = field(default_factory=list)      # (P, Q, label)
    angles: list[tuple[str, str, str, str]] = field(default_factory=list)  # (A, B, C, label)
    arcs: list[tuple[list[str], str]] = field(default_factory=list)        # (points, label)
    equal_segments: list[tuple[tuple[str, str], tuple[str, str]]] = field(default_factory=list)
    right_angles: list[tuple[tuple[str, str], tuple[str, str]]] = field(default_factory=list)
    parallels: list[tuple[tuple[str, str], tuple[str, str]]] = field(default_factory=list)
    on_line: list[tuple[str, str, str]] = field(default_factory=list)      # (P, A, B): P on AB
    on_circle: list[tuple[str, str, str]] = field(default_factory=list)    # (P, center, radius)


def _label(term: Term) -> str | None:
    """A value or expression leaf (``12``, ``2x+5``); an angle's name, ``MeasureOf(angle 1)``
    or ``MeasureOf(Angle(1))``, gives ``"angle 1"`` (drawn as a name, not a measure)."""
    if isinstance(term, str):
        return term.strip() or None
    if head(term) == "MeasureOf" and args(term) and isinstance(args(term)[0], str):
        name = args(term)[0].removeprefix("angle ").strip()
        return f"angle {name}" if name else None
    if head(term) == "MeasureOf" and args(term) and head(args(term)[0]) == "Angle":
        inner = args(args(term)[0])
        if len(inner) == 1 and isinstance(inner[0], str):
            return f"angle {inner[0].strip()}"
    return None


def _pair(term: Term) -> tuple[str, str] | None:
    n = names(term)
    return (n[0], n[1]) if head(term) == "Line" and len(n) == 2 else None


def _measured(term: Term) -> Term | None:
    """``Angle(...)``/``Arc(...)`` inside ``MeasureOf(...)`` (through ``Minor``/``Major``)."""
    if head(term) != "MeasureOf" or not args(term):
        return None
    inner = args(term)[0]
    while head(inner) in ("Minor", "Major") and args(inner):
        inner = args(inner)[0]
    return inner if head(inner) in ("Angle", "Arc") else None


def _equals(a: Term, b: Term, out: Facts) -> None:
    if head(a) == "LengthOf" and args(a) and _pair(args(a)[0]):
        seg = _pair(args(a)[0])
        assert seg is not None
        if head(b) == "LengthOf" and args(b) and _pair(args(b)[0]):
            out.equal_segments.append((seg, _pair(args(b)[0])))  # type: ignore[arg-type]
        elif (label := _label(b)) is not None:
            out.lengths.append((seg[0], seg[1], label))
        return
    measured = _measured(a)
    if measured is None:
        return
    pts = names(measured)
    label = _label(b)
    if label is None:
        return
    if head(measured) == "Angle" and len(pts) == 3:
        out.angles.append((pts[0], pts[1], pts[2], label))
    elif head(measured) == "Arc" and len(pts) >= 2:
        out.arcs.append((pts, label))


def facts(record: dict[str, Any]) -> Facts:
    """The drawable facts of one annotation's ``diagram_logic_forms`` (unparsable forms and
    predicates the renderer does not draw are skipped)."""
    out = Facts()
    for form in record.get("diagram_logic_forms") or []:
        if not form or not form.strip():
            continue
        try:
            term = parse(form)
        except ValueError:
            continue
        h, a = head(term), args(term)
        if h == "Equals" and len(a) == 2:
            _equals(a[0], a[1], out)
        elif h in ("Perpendicular", "Parallel") and len(a) == 2:
            p, q = _pair(a[0]), _pair(a[1])
            if p and q:
                (out.right_angles if h == "Perpendicular" else out.parallels).append((p, q))
        elif h == "PointLiesOnLine" and len(a) == 2 and isinstance(a[0], str) and _pair(a[1]):
            pair = _pair(a[1])
            assert pair is not None
            out.on_line.append((a[0], *pair))
        elif h == "PointLiesOnCircle" and len(a) == 2 and isinstance(a[0], str):
            c = names(a[1])
            if head(a[1]) == "Circle" and len(c) == 2:
                out.on_circle.append((a[0], c[0], c[1]))
    return out


def split_points(line: str, points: list[str]) -> tuple[str, str] | None:
    """``"FW'"`` -> ``("F", "W'")``: a ``line_instances`` entry split into two point names."""
    for name in sorted(points, key=len, reverse=True):
        if line.startswith(name) and line[len(name):] in points:
            return name, line[len(name):]
    return None


def as_text(record: dict[str, Any]) -> str:
    """The diagram annotation as text for language-only models: one logic form per line."""
    forms = [f.strip() for f in record.get("diagram_logic_forms") or [] if f and f.strip()]
    return "\n".join(forms)
