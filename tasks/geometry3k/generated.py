"""Generated geometry diagrams for the tiny vision-language testbed (issue 10).

Every problem is a small RGB picture plus a multiple-choice question whose text is the *same*
for every problem of a family, so the answer is determined by the picture alone (a model that
ignores the image is at chance, :data:`CHANCE`). Two families, drawn alternately:

* ``angle``: two rays from a common vertex near the centre, at a random rotation, ray lengths
  and vertex jitter; the angle between them is one of 30, 60, 90 or 120 degrees.
  "Find the angle x." -- choices ``A:30 B:60 C:90 D:120``.
* ``polygon``: a regular polygon with 3, 4, 5 or 6 sides, random rotation, radius and centre
  jitter, light fill and dark outline. "How many sides?" -- choices ``A:3 B:4 C:5 D:6``.

Pictures are drawn at 4x the target size with thick lines and downsampled with a Lanczos filter,
so the geometry survives at 32x32. The answer letter is drawn uniformly per problem, so every
letter is equally frequent. The warm-start reference is just ``\\boxed{<letter>}``.

Contract (shared with the ``geometry3k`` task): :func:`generate` returns ``Example`` objects with
``images=[PIL RGB image_size x image_size]``, ``answer={"value", "choices", "letter"}`` and
``meta={"reference", "family"}``.
"""

from __future__ import annotations

import math
import random

from PIL import Image, ImageDraw

from harness.types import Example

LETTERS = ("A", "B", "C", "D")
ANGLES = ("30", "60", "90", "120")
SIDES = ("3", "4", "5", "6")
FAMILIES = {
    "angle": ("Find the angle x.", ANGLES),
    "polygon": ("How many sides does the polygon have?", SIDES),
}
CHANCE: float = 1.0 / len(LETTERS)  # pass@1 of a uniform guess among the four letters
SCALE = 4  # supersampling factor of the renderer


def _prompt(question: str, choices: tuple[str, ...]) -> str:
    listed = " ".join(f"{letter}:{value}" for letter, value in zip(LETTERS, choices))
    return f"{question}\nChoices: {listed}\nAnswer:"


def angle_rays(degrees: float, size: float, rng: random.Random
               ) -> tuple[tuple[float, float], list[tuple[float, float]]]:
    """Vertex and the two ray ends (pixel coordinates in a ``size`` square, y down) of an angle
    of ``degrees`` at a random rotation, orientation, vertex jitter and ray lengths."""
    cx = size / 2 + rng.uniform(-0.08, 0.08) * size
    cy = size / 2 + rng.uniform(-0.08, 0.08) * size
    start = rng.uniform(0, 360)
    sign = rng.choice((-1, 1))
    ends = []
    for direction in (start, start + sign * degrees):
        length = rng.uniform(0.30, 0.40) * size
        rad = math.radians(direction)
        ends.append((cx + length * math.cos(rad), cy - length * math.sin(rad)))
    return (cx, cy), ends


def draw_angle(degrees: float, image_size: int, rng: random.Random) -> Image.Image:
    """Two rays from a vertex near the centre, ``degrees`` apart (:func:`angle_rays`)."""
    big = image_size * SCALE
    img = Image.new("RGB", (big, big), "white")
    draw = ImageDraw.Draw(img)
    (cx, cy), ends = angle_rays(degrees, big, rng)
    width = max(2, round(big / 16))
    for end in ends:
        draw.line([(cx, cy), end], fill="black", width=width)
    r = width / 2
    draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill="black")  # a clean vertex
    return img.resize((image_size, image_size), Image.Resampling.LANCZOS)


def draw_polygon(sides: int, image_size: int, rng: random.Random) -> Image.Image:
    """A regular ``sides``-gon with a random rotation, radius and centre."""
    big = image_size * SCALE
    img = Image.new("RGB", (big, big), "white")
    draw = ImageDraw.Draw(img)
    radius = rng.uniform(0.32, 0.42) * big
    cx = big / 2 + rng.uniform(-0.05, 0.05) * big
    cy = big / 2 + rng.uniform(-0.05, 0.05) * big
    start = rng.uniform(0, 2 * math.pi)
    points = [(cx + radius * math.cos(start + 2 * math.pi * k / sides),
               cy - radius * math.sin(start + 2 * math.pi * k / sides)) for k in range(sides)]
    draw.polygon(points, fill=(200, 200, 200), outline="black", width=max(2, round(big / 20)))
    return img.resize((image_size, image_size), Image.Resampling.LANCZOS)


def generate(count: int, seed: int, image_size: int) -> list[Example]:
    """``count`` problems, deterministic in ``seed``; families alternate, letters are uniform."""
    rng = random.Random(seed)
    names = list(FAMILIES)
    out = []
    for i in range(count):
        family = names[i % len(names)]
        question, choices = FAMILIES[family]
        k = rng.randrange(len(LETTERS))
        if family == "angle":
            image = draw_angle(float(choices[k]), image_size, rng)
        else:
            image = draw_polygon(int(choices[k]), image_size, rng)
        letter = LETTERS[k]
        out.append(Example(
            id=f"gen{seed}-{i}",
            prompt=_prompt(question, choices),
            answer={"value": choices[k], "choices": list(choices), "letter": letter},
            meta={"reference": f"\\boxed{{{letter}}}", "family": family},
            images=[image],
        ))
    return out
