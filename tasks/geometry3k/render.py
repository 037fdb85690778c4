"""Geometry3K diagrams rendered from Inter-GPS annotations (PIL, no plotting state).

The original test diagrams are not shipped, but Inter-GPS annotated every one of them: the
points with their pixel coordinates in the original image (``point_positions``), the lines
(``line_instances``), the circles (centres in ``circle_instances``, with the points on each in
``PointLiesOnCircle`` forms) and the facts the diagram states (``diagram_logic_forms``). The
renderer redraws that on a white square of ``size`` pixels:

* **Placement**: a similarity transform (uniform scale, no flip: annotation coordinates are
  image coordinates, y down) maps the bounding box of the points and circles into the square
  with a margin for labels. :class:`Layout` returns the transform and every point's pixel
  position, so a test can check each annotated point is drawn exactly where the annotation puts
  it. Points annotated without coordinates (``[-1, -1]``, 121 of the test set's points) are
  placed when the logic forms determine them - the intersection of two lines they lie on, or the
  foot of a stated perpendicular onto the line they lie on - and listed in ``Layout.inferred``;
  the others are left out (``Layout.missing``).
* **Drawing**: circles (radius = mean distance of their points from the centre), lines, a
  right-angle square for each ``Perpendicular``, ticks on segments stated equal, arrows on
  ``Parallel`` lines, an arc plus label for each stated angle (``60°``, ``(2x+5)°``, or an angle's
  name such as ``1``), each stated length at its segment's midpoint (on the side away from the
  figure's centre), arc measures beside their arc, point names, and finally each point as a
  filled disc in :data:`POINT_RGB` on top of everything. Each label takes the first of a few
  candidate spots (preferred first) that covers no ink and no point, else the least bad one.

:func:`diagram_png` caches the PNG on disk under ``$RLBENCH_CACHE`` (default
``~/.cache/rlbench``) ``/geometry3k/diagrams-v<RENDER_VERSION>/<sha256 of annotation and
size>.png``, so the 601 test diagrams are drawn once per machine.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from harness.config import cache_home
from tasks.geometry3k import logic

RENDER_VERSION = 2
POINT_RGB = (178, 0, 0)   # point discs: the only pixels of this colour
INK = (0, 0, 0)
POINT_RADIUS = 3
Vec = tuple[float, float]


@dataclass
class Layout:
    """Where things went: pixel = ``offset + scale * annotation``, per axis."""

    size: int
    scale: float
    offset: Vec
    points: dict[str, Vec] = field(default_factory=dict)  # pixel position of every drawn point
    inferred: list[str] = field(default_factory=list)     # placed from the logic forms
    missing: list[str] = field(default_factory=list)      # no coordinates, not determined

    def to_pixel(self, xy: Vec) -> Vec:
        return (self.offset[0] + self.scale * xy[0], self.offset[1] + self.scale * xy[1])


@dataclass
class Rendered:
    image: Image.Image
    layout: Layout


def _sub(a: Vec, b: Vec) -> Vec:
    return (a[0] - b[0], a[1] - b[1])


def _add(a: Vec, b: Vec, k: float = 1.0) -> Vec:
    return (a[0] + k * b[0], a[1] + k * b[1])


def _unit(v: Vec) -> Vec:
    n = math.hypot(*v)
    return (v[0] / n, v[1] / n) if n > 1e-9 else (0.0, 0.0)


def _cross(a: Vec, b: Vec) -> float:
    return a[0] * b[1] - a[1] * b[0]


def _intersect(p: Vec, p2: Vec, q: Vec, q2: Vec) -> Vec | None:
    """Intersection of the infinite lines p-p2 and q-q2 (None when parallel)."""
    r, s = _sub(p2, p), _sub(q2, q)
    den = _cross(r, s)
    if abs(den) < 1e-9 * (math.hypot(*r) * math.hypot(*s) + 1e-12):
        return None
    t = _cross(_sub(q, p), s) / den
    return _add(p, r, t)


def _foot(x: Vec, a: Vec, b: Vec) -> Vec:
    d = _sub(b, a)
    t = ((x[0] - a[0]) * d[0] + (x[1] - a[1]) * d[1]) / max(d[0] ** 2 + d[1] ** 2, 1e-12)
    return _add(a, d, t)


def annotated_points(record: dict[str, Any]) -> dict[str, Vec]:
    """The points the annotation gives coordinates for (``[-1, -1]`` means none)."""
    out = {}
    for name, xy in (record.get("point_positions") or {}).items():
        if (isinstance(xy, (list, tuple)) and len(xy) == 2
                and all(isinstance(v, (int, float)) and math.isfinite(v) for v in xy)
                and list(xy) != [-1, -1]):
            out[name] = (float(xy[0]), float(xy[1]))
    return out


def _infer(pos: dict[str, Vec], names: list[str], f: logic.Facts) -> list[str]:
    """Place points without coordinates that the logic forms determine; returns their names."""
    lines: dict[str, list[tuple[str, str]]] = {}
    for p, a, b in f.on_line:  # P on AB makes A, P, B collinear, so also A on PB, B on AP
        for x, y, z in ((p, a, b), (a, p, b), (b, a, p)):
            lines.setdefault(x, []).append((y, z))
    inferred: list[str] = []
    for _ in range(len(names)):
        progress = False
        for p in names:
            if p in pos:
                continue
            known = [(pos[a], pos[b]) for a, b in lines.get(p, [])
                     if a in pos and b in pos and math.dist(pos[a], pos[b]) > 1e-6]
            spot = None
            for i in range(len(known)):
                for j in range(i + 1, len(known)):
                    spot = spot or _intersect(*known[i], *known[j])
            if spot is None and known:
                for l1, l2 in f.right_angles:  # p the vertex of a right angle, on a known line
                    if p in l1 and p in l2:
                        x, y = l1[1 - l1.index(p)], l2[1 - l2.index(p)]
                        for src, on in ((x, y), (y, x)):
                            for a, b in lines.get(p, []):
                                if src in pos and on in (a, b) and a in pos and b in pos:
                                    spot = _foot(pos[src], pos[a], pos[b])
            if spot is not None and all(map(math.isfinite, spot)):
                pos[p] = spot
                inferred.append(p)
                progress = True
        if not progress:
            break
    return inferred


def _circles(record: dict[str, Any], f: logic.Facts, pos: dict[str, Vec],
             ) -> list[tuple[str, Vec, float]]:
    """(centre name, centre, radius) in annotation units, radius from the points on it."""
    groups: dict[tuple[str, str], list[float]] = {}
    for p, c, r in f.on_circle:
        if p in pos and c in pos:
            groups.setdefault((c, r), []).append(math.dist(pos[p], pos[c]))
    out = [(c, pos[c], sum(d) / len(d)) for (c, _), d in sorted(groups.items())
           if sum(d) / len(d) > 1e-6]
    return out


@lru_cache(maxsize=8)
def _font(px: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    try:
        import matplotlib

        path = Path(matplotlib.__file__).parent / "mpl-data" / "fonts" / "ttf" / "DejaVuSans.ttf"
        return ImageFont.truetype(str(path), px)
    except Exception:  # no matplotlib font or no FreeType: Pillow's built-in font
        return ImageFont.load_default(px)


def pretty(label: str) -> str:
    """Readable text for a LaTeX value: ``5\\sqrt{3}`` -> ``5√3``, ``\\frac{1}{2}`` -> ``1/2``."""
    out = label.replace("\\sqrt", "√").replace("\\pi", "π").replace("\\circ", "°")
    while "\\frac{" in out:
        i = out.index("\\frac{")
        j = out.find("}{", i)
        k = out.find("}", j + 2) if j >= 0 else -1
        if j < 0 or k < 0:
            break
        out = out[:i] + out[i + 6 : j] + "/" + out[j + 2 : k] + out[k + 1 :]
    return out.replace("{", "").replace("}", "").replace("\\", "").replace(" ", "")[:24]


def render(record: dict[str, Any], size: int = 336) -> Rendered:
    """Draw one annotation (a ``test_logic_forms.json`` record) on a ``size`` square."""
    names = list(record.get("point_instances") or [])
    pos = annotated_points(record)
    names += [p for p in pos if p not in names]
    f = logic.facts(record)
    inferred = _infer(pos, names, f)
    circles = _circles(record, f, pos)
    xs = [p[0] for p in pos.values()] + [c[0] + s * r for _, c, r in circles for s in (-1, 1)]
    ys = [p[1] for p in pos.values()] + [c[1] + s * r for _, c, r in circles for s in (-1, 1)]
    fs = max(8, size // 28)
    margin = max(2.2 * fs, 0.08 * size)
    if xs:
        span = max(max(xs) - min(xs), max(ys) - min(ys), 1e-6)
        scale = (size - 2 * margin) / span
        offset = (size / 2 - scale * (max(xs) + min(xs)) / 2,
                  size / 2 - scale * (max(ys) + min(ys)) / 2)
    else:
        scale, offset = 1.0, (size / 2, size / 2)
    layout = Layout(size=size, scale=scale, offset=offset, inferred=inferred,
                    missing=[p for p in names if p not in pos])
    px = {p: layout.to_pixel(xy) for p, xy in pos.items()}
    layout.points = dict(px)
    image = Image.new("RGB", (size, size), (255, 255, 255))
    _Painter(image, px, fs, size).draw(record, f, circles, layout)
    return Rendered(image=image, layout=layout)


class _Painter:
    """Draws geometry first, then labels (each at the first of its candidate spots that covers
    no ink and no point, else the least-covering one), then the point discs on top."""

    def __init__(self, image: Image.Image, px: dict[str, Vec], fs: int, size: int):
        self.image, self.d, self.px, self.fs, self.size = image, ImageDraw.Draw(image), px, fs, size
        self.width = max(1, round(size / 224))
        self.font, self.small = _font(fs), _font(max(7, fs - 2))
        pts = list(px.values())
        self.centre = ((sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts))
                       if pts else (size / 2, size / 2))

    def seg(self, a: str, b: str) -> tuple[Vec, Vec] | None:
        if a in self.px and b in self.px and math.dist(self.px[a], self.px[b]) > 1e-6:
            return self.px[a], self.px[b]
        return None

    def _cost(self, box: tuple[float, float, float, float]) -> float:
        x0, y0, x1, y1 = (round(v) for v in box)
        outside = max(0, -x0) + max(0, -y0) + max(0, x1 - self.size) + max(0, y1 - self.size)
        crop = self.image.crop((max(x0, 0), max(y0, 0), min(x1, self.size), min(y1, self.size)))
        ink = sum(crop.convert("L").histogram()[:200]) if crop.width and crop.height else 0
        pad = POINT_RADIUS + 2
        points = sum(x0 - pad <= x <= x1 + pad and y0 - pad <= y <= y1 + pad
                     for x, y in self.px.values())
        return ink + 40 * points + 100 * outside

    def label(self, spots: list[Vec], text: str, small: bool = False) -> None:
        """Write ``text`` at the best of ``spots`` (preferred first)."""
        font = self.small if small else self.font
        best, best_cost = spots[0], math.inf
        for i, at in enumerate(spots):
            cost = self._cost(self.d.textbbox(at, text, font=font, anchor="mm")) + 0.5 * i
            if cost < best_cost:
                best, best_cost = at, cost
            if cost <= 0.5 * i:
                break
        self.d.text(best, text, fill=INK, font=font, anchor="mm")

    def away(self, at: Vec, normal: Vec) -> Vec:
        """``normal`` flipped to point away from the figure's centre."""
        d = _sub(at, self.centre)
        return normal if d[0] * normal[0] + d[1] * normal[1] >= 0 else (-normal[0], -normal[1])

    def draw(self, record: dict[str, Any], f: logic.Facts,
             circles: list[tuple[str, Vec, float]], layout: Layout) -> None:
        for _, c, r in circles:
            cx, cy = layout.to_pixel(c)
            rr = r * layout.scale
            self.d.ellipse((cx - rr, cy - rr, cx + rr, cy + rr), outline=INK, width=self.width)
        names = list(self.px)
        segs = [logic.split_points(s, names) for s in record.get("line_instances") or []]
        segs += [(a, b) for a, b, _ in f.lengths]
        for pair in segs:
            s = pair and self.seg(*pair)
            if s:
                self.d.line(s, fill=INK, width=self.width)
        for l1, l2 in f.right_angles:
            self.right_angle(l1, l2)
        for pairs in f.equal_segments:
            for pair in pairs:
                self.tick(pair)
        for pairs in f.parallels:
            for pair in pairs:
                self.arrow(pair)
        angle_spots = [self.angle(a, b, c) for a, b, c, _ in f.angles]
        for name, p in self.px.items():  # names first: they matter most next to their point
            first = _unit(self.away(p, (0.7, -0.7)))
            turns = [math.atan2(first[1], first[0]) + k * math.pi / 4
                     for k in (0, 1, -1, 2, -2, 3, -3, 4)]
            self.label([_add(p, (math.cos(t), math.sin(t)), 0.95 * self.fs) for t in turns], name)
        for (_, _, _, label), spots in zip(f.angles, angle_spots):
            if spots:
                named = label.startswith("angle ")
                self.label(spots, label[6:] if named else pretty(label) + "°", small=named)
        for a, b, label in f.lengths:
            s = self.seg(a, b)
            if s:
                u = _unit(_sub(s[1], s[0]))
                n = self.away(_add(s[0], _sub(s[1], s[0]), 0.5), (-u[1], u[0]))
                spots = [_add(_add(s[0], _sub(s[1], s[0]), t), n, k * self.fs)
                         for k in (0.9, -0.9, 1.5, -1.5) for t in (0.5, 0.35, 0.65)]
                self.label(spots, pretty(label))
        for pts, label in f.arcs:
            self.arc_label(pts, label, f, circles)
        r = POINT_RADIUS
        for x, y in self.px.values():
            self.d.ellipse((x - r, y - r, x + r, y + r), fill=POINT_RGB)

    def right_angle(self, l1: tuple[str, str], l2: tuple[str, str]) -> None:
        s1, s2 = self.seg(*l1), self.seg(*l2)
        if not (s1 and s2):
            return
        v = _intersect(*s1, *s2)
        if v is None:
            return
        far1 = max(s1, key=lambda p: math.dist(p, v))
        far2 = max(s2, key=lambda p: math.dist(p, v))
        k = 0.6 * self.fs
        u1, u2 = _unit(_sub(far1, v)), _unit(_sub(far2, v))
        a, b = _add(v, u1, k), _add(v, u2, k)
        self.d.line([a, _add(a, u2, k), b], fill=INK, width=self.width)

    def tick(self, pair: tuple[str, str]) -> None:
        s = self.seg(*pair)
        if s:
            mid = _add(s[0], _sub(s[1], s[0]), 0.5)
            u = _unit(_sub(s[1], s[0]))
            n = (-u[1] * 0.3 * self.fs, u[0] * 0.3 * self.fs)
            self.d.line([_add(mid, n), _add(mid, n, -1)], fill=INK, width=self.width)

    def arrow(self, pair: tuple[str, str]) -> None:
        s = self.seg(*pair)
        if s:
            mid = _add(s[0], _sub(s[1], s[0]), 0.5)
            u = _unit(_sub(s[1], s[0]))
            k = 0.3 * self.fs
            back = _add(mid, u, -k)
            self.d.line([_add(back, (-u[1], u[0]), k), mid, _add(back, (u[1], -u[0]), k)],
                        fill=INK, width=self.width)

    def angle(self, a: str, b: str, c: str) -> list[Vec]:
        """Draw the arc of angle ABC; return the candidate spots of its label."""
        if not (self.seg(a, b) and self.seg(c, b)):
            return []
        v = self.px[b]
        u1, u2 = _unit(_sub(self.px[a], v)), _unit(_sub(self.px[c], v))
        r = min(1.2 * self.fs, 0.45 * min(math.dist(self.px[a], v), math.dist(self.px[c], v)))
        a1 = math.degrees(math.atan2(u1[1], u1[0]))
        a2 = math.degrees(math.atan2(u2[1], u2[0]))
        start, end = (a1, a2) if (a2 - a1) % 360 <= 180 else (a2, a1)
        self.d.arc((v[0] - r, v[1] - r, v[0] + r, v[1] + r), start, end, fill=INK,
                   width=self.width)
        bis = _unit(_add(u1, u2))
        if bis == (0.0, 0.0):
            bis = (-u1[1], u1[0])
        t = math.atan2(bis[1], bis[0])
        return [_add(v, (math.cos(t + dt), math.sin(t + dt)), r + k * self.fs)
                for k in (0.9, 1.6, 2.3) for dt in (0.0, 0.3, -0.3)]

    def arc_label(self, pts: list[str], label: str, f: logic.Facts,
                  circles: list[tuple[str, Vec, float]]) -> None:
        if not all(p in self.px for p in pts):
            return
        ends = [self.px[pts[0]], self.px[pts[-1]]]
        centre = next((c for c, _, _ in circles
                       if any(p == pts[0] and cc == c for p, cc, _ in f.on_circle)), None)
        at = self.px[pts[1]] if len(pts) == 3 else _add(ends[0], _sub(ends[1], ends[0]), 0.5)
        spots = [at]
        if centre is not None and centre in self.px:
            o = self.px[centre]
            d = _unit(_sub(at, o)) if len(pts) == 3 else _unit(_add(_sub(ends[0], o),
                                                                    _sub(ends[1], o)))
            rad = math.dist(ends[0], o)
            spots = [_add(o, d, rad + k * self.fs) for k in (0.9, 1.6, -0.9)]
        self.label(spots, pretty(label) + "°")


def diagram_key(record: dict[str, Any], size: int) -> str:
    payload = json.dumps({"v": RENDER_VERSION, "size": size, "record": record}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def diagram_png(record: dict[str, Any], size: int = 336, cache_dir: Path | None = None) -> bytes:
    """The rendered diagram as PNG bytes, from the disk cache when it is there."""
    root = Path(cache_dir) if cache_dir else cache_home()
    path = root / "geometry3k" / f"diagrams-v{RENDER_VERSION}" / f"{diagram_key(record, size)}.png"
    if path.is_file():
        return path.read_bytes()
    buf = io.BytesIO()
    render(record, size).image.save(buf, format="PNG", optimize=False)
    data = buf.getvalue()
    try:  # write-then-rename, so a concurrent reader never sees half a file
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except OSError:  # a read-only cache only costs re-rendering
        pass
    return data
