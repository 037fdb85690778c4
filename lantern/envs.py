"""Labelled gridworlds whose tasks are given by a DFA over subgoal events (reward machines).

A map is an ASCII grid: ``#`` wall, ``.`` floor, ``S`` the start cell, and lower-case letters or
``*`` for labelled cells. Stepping onto a labelled cell emits its event ``e ∈ Σ``; the task's DFA
``D = (Ω, ω_0, Σ, δ, F)`` advances ``ω ← δ(ω, e)`` (cells without a label emit nothing and leave
ω as it is). The agent's state is the product ``(s, ω)``: the cell and the automaton state.

    reward r_t = 1  when ω enters an accepting state (the episode ends: success)
    r_t = 0         otherwise; a rejecting sink (e.g. a decoration was touched) ends it (failure)

Actions: up, down, left, right; a move into a wall leaves the agent in place. Transitions are
deterministic (optionally a ``slip`` probability of a uniformly random action).

All maps share one shape, so a cell index ``s`` means the same coordinates in every map: that is
what lets a source task's Q-table be read at the target's cell (``s_k = s`` in the spec's
``π_k(a | s_k, ω_k)``), including for the deliberately misaligned sources drawn in another map.

Maps (registered in :data:`lantern.ENVS`):

* ``office`` — office world in the style of Toro Icarte et al.'s reward-machine benchmark:
  ``c`` coffee, ``m`` mail, ``o`` office, ``a``/``b`` rooms, ``*`` decorations (to avoid);
* ``office_mirrored`` — the same rooms with coffee, mail and office moved: a source task
  described with the same words teaches the wrong places (semantic match, behavioural mismatch);
* ``craft`` — craft world: ``w`` wood, ``i`` iron, ``g`` grass, ``k`` workbench, ``t`` toolshed,
  ``f`` factory, ``*`` lava (to avoid).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from harness.registry import Registry

ENVS: Registry = Registry("lantern environment")

ACTIONS: tuple[tuple[int, int], ...] = ((-1, 0), (1, 0), (0, -1), (0, 1))  # up down left right
ACTION_NAMES = ("up", "down", "left", "right")
WALL, FLOOR, START = "#", ".", "S"

OFFICE = (
    "###########",
    "#a...#...m#",
    "#.*...*...#",
    "#....#....#",
    "##.####.###",
    "#c...S....#",
    "#....#....#",
    "##.####.###",
    "#b*.......#",
    "#....#..o.#",
    "###########",
)

# Same walls, decorations and start; coffee, mail and office (and room b) elsewhere.
OFFICE_MIRRORED = (
    "###########",
    "#a...#...c#",
    "#.*...*...#",
    "#....#....#",
    "##.####.###",
    "#m...S....#",
    "#....#....#",
    "##.####.###",
    "#o*.......#",
    "#....#..b.#",
    "###########",
)

CRAFT = (
    "###########",
    "#w.......g#",
    "#..##.....#",
    "#..#..*...#",
    "#.....#...#",
    "#.k..S#..i#",
    "#.....#...#",
    "#..*......#",
    "#....####.#",
    "#t.......f#",
    "###########",
)

# Phrases the template parser understands, per map: phrase -> event (the cell's letter).
OFFICE_VOCAB = {
    "get coffee": "c", "get the coffee": "c", "fetch coffee": "c",
    "get mail": "m", "get the mail": "m", "fetch the mail": "m",
    "go to the office": "o", "go to office": "o",
    "go to room a": "a", "go to room b": "b",
    "decorations": "*", "the decorations": "*",
    # paraphrases (office_cmo_paraphrased's sources): other words for the same subgoals
    "grab a coffee": "c", "pick up a coffee": "c",
    "collect the post": "m", "pick up the post": "m",
    "head to the office": "o", "walk to the office": "o",
    "visit room a": "a", "visit room b": "b",
    "the ornaments": "*", "ornaments": "*",
}
CRAFT_VOCAB = {
    "get wood": "w", "collect wood": "w", "get iron": "i", "collect iron": "i",
    "get grass": "g", "collect grass": "g",
    "use the workbench": "k", "use the toolshed": "t", "use the factory": "f",
    "lava": "*", "the lava": "*",
}


@dataclass(frozen=True)
class GridMap:
    """A labelled grid. ``labels[s]`` is the event of cell ``s`` ('' for none)."""

    name: str
    rows: tuple[str, ...]
    vocab: dict[str, str] = field(hash=False, compare=False)
    hazard_word: str = "decorations"

    @property
    def height(self) -> int:
        return len(self.rows)

    @property
    def width(self) -> int:
        return len(self.rows[0])

    @property
    def n_cells(self) -> int:
        return self.height * self.width

    def cell(self, s: int) -> str:
        return self.rows[s // self.width][s % self.width]

    def label(self, s: int) -> str:
        c = self.cell(s)
        return "" if c in (WALL, FLOOR, START) else c

    @property
    def start(self) -> int:
        for r, row in enumerate(self.rows):
            if START in row:
                return r * self.width + row.index(START)
        raise ValueError(f"map {self.name!r} has no start cell {START!r}")

    @property
    def events(self) -> list[str]:
        """Σ: every event some cell emits, sorted."""
        return sorted({self.label(s) for s in range(self.n_cells)} - {""})

    def move(self, s: int, a: int) -> int:
        dr, dc = ACTIONS[a]
        r, c = divmod(s, self.width)
        nr, nc = r + dr, c + dc
        if not (0 <= nr < self.height and 0 <= nc < self.width) or self.rows[nr][nc] == WALL:
            return s
        return nr * self.width + nc


def _check_shapes(*maps: tuple[str, ...]) -> None:
    shapes = {(len(m), len(m[0])) for m in maps}
    widths = {len(row) for m in maps for row in m}
    if len(shapes) != 1 or len(widths) != 1:
        raise ValueError("all LANTERN maps must share one shape (cells are matched by index)")


_check_shapes(OFFICE, OFFICE_MIRRORED, CRAFT)
ENVS.register("office", GridMap("office", OFFICE, OFFICE_VOCAB, "decorations"))
ENVS.register("office_mirrored", GridMap("office_mirrored", OFFICE_MIRRORED, OFFICE_VOCAB,
                                         "decorations"))
ENVS.register("craft", GridMap("craft", CRAFT, CRAFT_VOCAB, "lava"))


class AutomatonGridEnv:
    """One task: a map and a DFA over its events. ``reset() -> (s, ω)``,
    ``step(a) -> (s', ω', r, done, success)``."""

    def __init__(self, grid: GridMap, dfa: object, max_steps: int = 150, slip: float = 0.0,
                 rng: random.Random | None = None, random_start: bool = False) -> None:
        from lantern.dfa import Dfa

        assert isinstance(dfa, Dfa)
        missing = sorted(set(dfa.alphabet) - set(grid.events))
        if missing:
            raise ValueError(f"DFA events {missing} do not occur in map {grid.name!r} "
                             f"(its events: {grid.events})")
        self.grid, self.dfa, self.max_steps, self.slip = grid, dfa, max_steps, slip
        # Exploring starts (source training): every unlabelled floor cell, so a source's Q-table
        # is learned over the whole map, not only along its own path from S.
        self.random_start = random_start
        self._starts = [s for s in range(grid.n_cells)
                        if grid.cell(s) in (FLOOR, START)]
        self.rng = rng or random.Random(0)
        # Precomputed tables: the step is the inner loop of every run.
        self._next = [[grid.move(s, a) for a in range(len(ACTIONS))] for s in range(grid.n_cells)]
        self._label = [grid.label(s) for s in range(grid.n_cells)]
        self._terminal = dfa.accepting | dfa.rejecting
        self.s, self.q, self.t = grid.start, dfa.initial, 0

    @property
    def n_actions(self) -> int:
        return len(ACTIONS)

    def reset(self) -> tuple[int, int]:
        start = self.rng.choice(self._starts) if self.random_start else self.grid.start
        self.s, self.q, self.t = start, self.dfa.initial, 0
        return self.s, self.q

    def step(self, a: int) -> tuple[int, int, float, bool, bool]:
        if self.slip > 0.0 and self.rng.random() < self.slip:
            a = self.rng.randrange(len(ACTIONS))
        self.s = self._next[self.s][a]
        event = self._label[self.s]
        if event:
            self.q = self.dfa.step(self.q, event)
        self.t += 1
        success = self.q in self.dfa.accepting
        done = self.q in self._terminal or self.t >= self.max_steps
        return self.s, self.q, (1.0 if success else 0.0), done, success
