"""Generated Geometry3K diagrams (tasks/geometry3k/generated.py): the contract the task relies
on, and that only the picture -- never the text -- tells the answers apart."""

from collections import Counter

import numpy as np
from PIL import Image

from tasks.geometry3k import generated
from tasks.geometry3k.generated import CHANCE, generate


def test_examples_follow_the_contract():
    for ex in generate(8, 3, 32):
        (image,) = ex.images
        assert isinstance(image, Image.Image) and image.mode == "RGB" and image.size == (32, 32)
        assert set(ex.answer) == {"value", "choices", "letter"}
        assert ex.answer["choices"][generated.LETTERS.index(ex.answer["letter"])] == \
            ex.answer["value"]
        assert ex.meta["reference"] == f"\\boxed{{{ex.answer['letter']}}}"
        assert ex.meta["family"] in generated.FAMILIES
        assert all(f"{letter}:{value}" in ex.prompt
                   for letter, value in zip(generated.LETTERS, ex.answer["choices"]))
    assert generate(3, 0, 48)[0].images[0].size == (48, 48)


def test_generation_is_deterministic_in_the_seed():
    a, b, c = generate(6, 5, 32), generate(6, 5, 32), generate(6, 6, 32)
    assert [x.images[0].tobytes() for x in a] == [x.images[0].tobytes() for x in b]
    assert [x.answer for x in a] == [x.answer for x in b]
    assert [x.images[0].tobytes() for x in a] != [x.images[0].tobytes() for x in c]


def test_the_text_is_the_same_for_every_answer_of_a_family():
    examples = generate(400, 0, 32)
    for family in generated.FAMILIES:
        members = [ex for ex in examples if ex.meta["family"] == family]
        assert len({ex.prompt for ex in members}) == 1  # the text cannot give the answer away
        assert {ex.answer["letter"] for ex in members} == set(generated.LETTERS)


def test_letters_are_uniform_so_chance_is_a_quarter():
    counts = Counter(ex.answer["letter"] for ex in generate(2000, 0, 32))
    assert CHANCE == 0.25
    assert all(abs(c / 2000 - CHANCE) < 0.04 for c in counts.values())


def test_the_drawn_angle_is_the_answers_angle():
    """The rays' directions differ by the answer, and the picture has ink along both rays and
    none far from them (drawn at 128 px, checked on the same geometry)."""
    import random

    for degrees in (30, 60, 90, 120):
        vertex, ends = generated.angle_rays(degrees, 128 * generated.SCALE, random.Random(degrees))
        u, v = (np.subtract(e, vertex) for e in ends)
        measured = np.degrees(np.arccos(u @ v / np.linalg.norm(u) / np.linalg.norm(v)))
        assert abs(measured - degrees) < 1e-6
        image = generated.draw_angle(degrees, 128, random.Random(degrees))
        ink = 255 - np.asarray(image.convert("L"), dtype=float)
        for end in ends:  # ink at 3/4 of the way along each ray
            x, y = (np.add(vertex, 0.75 * np.subtract(end, vertex)) / generated.SCALE).astype(int)
            assert ink[y, x] > 128
        ys, xs = np.nonzero(ink > 128)
        pts = np.stack([xs, ys], 1) * generated.SCALE
        rel = pts - np.asarray(vertex)
        dist = [np.abs(d[0] * rel[:, 1] - d[1] * rel[:, 0]) / np.linalg.norm(d)
                for d in (np.subtract(e, vertex) for e in ends)]
        assert (np.minimum(*dist) < 8 * generated.SCALE).all()  # every ink pixel on a ray


def test_polygons_have_the_answers_number_of_corners():
    import random

    areas = []
    for sides in (3, 4, 5, 6):
        image = generated.draw_polygon(sides, 128, random.Random(0))
        areas.append(float((255 - np.asarray(image.convert("L"), dtype=float)).sum()))
    assert areas == sorted(areas)  # same radius: more sides cover more of the circle
