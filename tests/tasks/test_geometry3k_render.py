"""The diagram renderer: every annotated point is drawn at its coordinates (a sample of real test
problems, checked on the pixels), points without coordinates are placed only when the logic
forms determine them, stated facts add ink, circles pass through their points, and PNGs are
cached on disk by annotation hash."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from tasks.geometry3k import datasets, logic, render

FORMS = datasets.logic_forms()
SAMPLE = sorted(set(random.Random(0).sample(sorted(FORMS), 60)) | {"2401", "2402", "2505"})


def _marker_mask(image) -> np.ndarray:
    return np.all(np.asarray(image) == np.array(render.POINT_RGB, dtype=np.uint8), axis=-1)


@pytest.mark.parametrize("pid", SAMPLE)
def test_every_annotated_point_is_drawn_at_its_coordinates(pid):
    record = FORMS[pid]
    out = render.render(record, size=336)
    layout = out.layout
    annotated = render.annotated_points(record)
    assert annotated, pid
    mask = _marker_mask(out.image)
    ys, xs = np.nonzero(mask)
    assert layout.scale > 0
    for name, xy in annotated.items():
        px, py = layout.to_pixel(xy)
        assert layout.points[name] == (px, py)
        assert 0 <= px < 336 and 0 <= py < 336, (pid, name)
        # the point's marker disc covers its pixel and is centred on it
        assert mask[round(py), round(px)], (pid, name)
        box = render.POINT_RADIUS + 1
        near = (np.abs(xs - px) <= box) & (np.abs(ys - py) <= box)
        others = [q for n, q in layout.points.items() if n != name and math.dist(q, (px, py)) < 10]
        if not others:  # an isolated disc: its centroid is the point, to a pixel
            assert abs(xs[near].mean() - px) <= 1.0 and abs(ys[near].mean() - py) <= 1.0
    # and marker pixels appear nowhere else: each lies within a disc of a drawn point
    centres = np.array(list(layout.points.values()))
    d = np.hypot(xs[:, None] - centres[None, :, 0], ys[:, None] - centres[None, :, 1]).min(1)
    assert (d <= render.POINT_RADIUS + 1.5).all(), pid


@pytest.mark.slow
def test_all_601_test_diagrams_have_a_marker_at_every_annotated_point():
    for pid, record in FORMS.items():
        out = render.render(record, size=336)
        mask = _marker_mask(out.image)
        for name, xy in render.annotated_points(record).items():
            px, py = out.layout.to_pixel(xy)
            assert mask[round(py), round(px)], (pid, name)


def test_the_placement_is_a_similarity_of_the_annotation():
    record = FORMS["2401"]  # A (0,188), B (93,1), C (185,185)
    layout = render.render(record, size=200).layout
    a, b, c = (layout.points[n] for n in "ABC")
    ratio = math.dist(a, b) / math.dist((0, 188), (93, 1))
    assert math.dist(b, c) / math.dist((93, 1), (185, 185)) == pytest.approx(ratio)
    assert b[1] < a[1] and a[0] < c[0]  # y down, no flip: B is the apex at the top


def test_points_without_coordinates_are_placed_only_when_the_forms_determine_them():
    # 2401: D on AC with BD perpendicular to DC -> the foot of B on AC
    lay = render.render(FORMS["2401"]).layout
    ann = render.annotated_points(FORMS["2401"])
    foot = render._foot(ann["B"], ann["A"], ann["C"])
    assert lay.inferred == ["D"] and lay.points["D"] == pytest.approx(lay.to_pixel(foot))
    # 2505: E on AB and on CD -> their intersection
    lay = render.render(FORMS["2505"]).layout
    ann = render.annotated_points(FORMS["2505"])
    cross = render._intersect(ann["A"], ann["B"], ann["C"], ann["D"])
    assert "E" in lay.inferred and lay.points["E"] == pytest.approx(lay.to_pixel(cross))
    # 2432: F has no coordinates and no form about it: left out, not guessed
    lay = render.render(FORMS["2432"]).layout
    assert lay.missing == ["F"] and "F" not in lay.points


def _ink(image) -> np.ndarray:
    return np.asarray(image.convert("L")) < 128


def test_stated_lengths_and_angles_add_labels_to_the_drawing():
    record = FORMS["2433"]  # x, y, 17 and a 60 degree angle at C
    forms = record["diagram_logic_forms"]
    full = _ink(render.render(record).image)
    for form in ("Equals(LengthOf(Line(B, C)), 17)", "Equals(MeasureOf(Angle(A, C, B)), 60)"):
        assert form in forms
        bare = dict(record, diagram_logic_forms=[f for f in forms if f != form])
        diff = full & ~_ink(render.render(bare).image)
        assert diff.sum() > 20, form  # the label's glyphs (and the angle's arc)


def test_circles_pass_through_their_points():
    record = FORMS["2402"]  # circle O through B, C, D
    out = render.render(record)
    ink = _ink(out.image)
    o = out.layout.points["O"]
    r = math.dist(o, out.layout.points["C"])
    hits = 0
    for k in range(36):
        t = 2 * math.pi * k / 36
        x, y = o[0] + r * math.cos(t), o[1] + r * math.sin(t)
        hits += bool(ink[round(y) - 1 : round(y) + 2, round(x) - 1 : round(x) + 2].any())
    assert hits >= 34


def test_pretty_labels_and_angle_names():
    assert render.pretty("5\\sqrt{3}") == "5√3"
    assert render.pretty("\\frac{1}{2}x+3") == "1/2x+3"
    f = logic.facts({"diagram_logic_forms": [
        "Equals(MeasureOf(Angle(A, B, C)), MeasureOf(angle 1))",
        "Equals(MeasureOf(Angle(A, B, D)), 2x+5)"]})
    assert f.angles == [("A", "B", "C", "angle 1"), ("A", "B", "D", "2x+5")]


def test_malformed_annotations_render_without_crashing():
    for record in ({}, {"point_positions": {"A": [-1, -1]}},
                   {"point_positions": {"A": [1.0, 2.0], "B": "x"}, "line_instances": ["AB", ""],
                    "diagram_logic_forms": ["Equals(LengthOf(Line(A, B)", "))((", "", "Foo(A)",
                                            "Perpendicular(Line(A, A), Line(A, A))",
                                            "PointLiesOnCircle(A, Circle(A, radius_0_0))"]}):
        out = render.render(record, size=64)
        assert out.image.size == (64, 64) and out.image.mode == "RGB"
    with pytest.raises(ValueError):
        logic.parse("Equals(LengthOf(Line(A, B)), 12")


def test_diagram_png_is_cached_on_disk_by_annotation_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("RLBENCH_CACHE", str(tmp_path))
    record = FORMS["2410"]
    data = render.diagram_png(record, 96)
    files = list(tmp_path.glob("geometry3k/diagrams-v*/*.png"))
    assert len(files) == 1 and files[0].read_bytes() == data
    assert files[0].stem == render.diagram_key(record, 96)

    def boom(*a, **k):
        raise AssertionError("rendered again")

    monkeypatch.setattr(render, "render", boom)
    assert render.diagram_png(record, 96) == data  # served from the cache
    with pytest.raises(AssertionError, match="rendered again"):
        render.diagram_png(record, 97)  # another size is another key
