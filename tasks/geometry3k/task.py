"""Geometry3K: geometry problems with a diagram, answered by choice letter or by value.

Two variants (``task.variant``):

* ``full`` - the 601 Geometry3K test problems (Inter-GPS ids 2401..3001) shipped in
  ``tasks/geometry3k/data`` (:mod:`tasks.geometry3k.datasets`), each with a diagram rendered
  from Inter-GPS's annotation (:mod:`tasks.geometry3k.render`); or, from a user-supplied path,
  the original Inter-GPS layout (with answer choices and the original diagrams) or the Hugging
  Face ``hiyouga/geometry3k`` parquet files. ``full.mode=text`` gives language-only models the
  problem text plus the diagram's logic forms instead of an image.
* ``tiny`` - generated diagrams (:mod:`tasks.geometry3k.generated`, the tiny vision-language
  model's testbed) with eval sets ``generated`` (held-out, another seed) and
  ``generated_shuffled`` (the same problems, images permuted across problems by a fixed
  derangement: a model that reads the image drops to chance there).

Every example's ``answer`` is ``{"value", "choices", "letter"}``, so grading is one code path:
the answer is extracted as for MATH (:mod:`harness.mathgrade.extract`: last ``\\boxed{}``, then
``Answer:``, then the last number; each method counted); on a problem with choices an answer
that is a choice letter (``B``, ``(B)``, ``B. 60``, ``\\text{B}``) is graded by letter, any other
answer is graded as a value against the gold value by math-verify in worker processes
(:class:`harness.mathgrade.MathGrader`, hard per-item timeouts). Per-sample statistics:
``extract_<method>``, ``parse_letter`` / ``parse_value`` (which kind of answer was given),
``grade_timeout``, ``grade_error`` (docs/metrics.md). Model output is only scanned, never run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import io
import random
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from harness.compat import BINARY_CORRECT, IMAGES
from harness.mathgrade.extract import METHODS, check_methods, extract_answer
from harness.mathgrade.grading import GraderConfig, MathGrader, answer_reward, grading_stats
from harness.registry import register_task
from harness.task import EvalProtocol, VariantTask
from harness.types import Example, Score
from tasks.geometry3k import datasets, logic, render

MODES = ("image", "text")
TEMPLATES = ("chat", "plain")
FULL_EVAL_SETS = ("test", "val")
TINY_EVAL_SETS = ("generated", "generated_shuffled")
VALUE_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
CHOICE_INSTRUCTION = ("Please reason step by step, and put the letter of the correct choice "
                      "within \\boxed{} (for example \\boxed{B}).")
_LETTER_RE = re.compile(r"^\(?\s*([A-H])\s*(?:[).:].*)?$", re.DOTALL)
_WRAP_RE = re.compile(r"^\\(?:text|textbf|mathrm|mathbf)\s*\{(.*)\}$", re.DOTALL)


def prompt_text(problem: str, choices: list[str] | None = None,
                diagram: str | None = None) -> str:
    """The question as text: the problem, the diagram's logic forms (text mode), the choices
    as ``A. ..`` lines, and the instruction for a letter or a value."""
    parts = [problem.strip()]
    if diagram:
        parts.append("The diagram, as logic forms:\n" + diagram)
    if choices:
        parts.append("Choices:\n" + "\n".join(f"{datasets.LETTERS[i]}. {c}"
                                              for i, c in enumerate(choices)))
    parts.append(CHOICE_INSTRUCTION if choices else VALUE_INSTRUCTION)
    return "\n".join(parts)


def render_prompt(template: str, text: str) -> str | list[dict[str, str]]:
    """``chat``: one user message (the engine adds the image and the chat template);
    ``plain``: the text followed by a newline."""
    if template == "chat":
        return [{"role": "user", "content": text}]
    if template == "plain":
        return text + "\n"
    raise ValueError(f"task.full.template={template!r} is not valid; valid: {', '.join(TEMPLATES)}")


def choice_letter(answer: str, choices: list[str] | None) -> str | None:
    """The choice letter an extracted answer names (``B``, ``(B)``, ``B. 60``, ``\\text{B}``),
    or None when it is not one of the problem's letters."""
    if not choices:
        return None
    text = answer.strip().strip("$").strip()
    for _ in range(3):  # \text{\textbf{B}}: unwrap a bounded number of times
        m = _WRAP_RE.match(text)
        if not m:
            break
        text = m.group(1).strip()
    m = _LETTER_RE.match(text[:200])
    if m and datasets.LETTERS.index(m.group(1)) < len(choices):
        return m.group(1)
    return None


def lazy_png(data: bytes) -> Any:
    """A PIL image over encoded PNG bytes, decoded on first pixel access (601 decoded diagrams
    would hold ~200 MB); ``info["sha256"]`` is the digest of the bytes (the dataset hash)."""
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    image.info["sha256"] = hashlib.sha256(data).hexdigest()
    return image


def derangement(n: int, seed: int) -> list[int]:
    """A seeded permutation without fixed points (Sattolo's algorithm: one n-cycle)."""
    perm = list(range(n))
    rng = random.Random(seed)
    for i in range(n - 1, 0, -1):
        j = rng.randrange(i)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def shuffle_images(examples: list[Example], seed: int) -> list[Example]:
    """Copies of ``examples`` whose images come from another problem (a fixed derangement)."""
    perm = derangement(len(examples), seed)
    return [dataclasses.replace(ex, id=f"{ex.id}/shuffled", images=examples[j].images,
                                meta={**ex.meta, "image_from": examples[j].id})
            for ex, j in zip(examples, perm)]


def _tiny_eval_default() -> dict[str, EvalProtocol]:
    return {name: EvalProtocol(n=8, k=[1, 8], temperature=1.0, top_p=1.0, max_new_tokens=24,
                               maj_k=[8]) for name in TINY_EVAL_SETS}


@dataclass
class TinyConfig:
    train_size: int = 2000     # generated training problems
    eval_size: int = 200       # held-out problems (eval sets generated, generated_shuffled)
    seed: int = 0              # generator seed of the train pool
    eval_seed: int = 1         # generator seed of the held-out problems (!= seed)
    shuffle_seed: int = 0      # the derangement of images in generated_shuffled
    image_size: int = 32       # generated diagram side in pixels
    max_new_tokens: int = 24
    eval: dict[str, EvalProtocol] = field(default_factory=_tiny_eval_default)


@dataclass
class FullConfig:
    source: str = "bundled"     # bundled | intergps | parquet
    path: str | None = None     # root of the Inter-GPS layout / parquet file or directory
    mode: str = "image"         # image | text
    template: str = "chat"      # chat | plain
    render_size: int = 336      # side of rendered diagrams (bundled test set) in pixels
    train_split: str = "auto"   # auto | train | val | test
    train_limit: int | None = None
    warmstart_limit: int = 2000
    max_new_tokens: int = 2048
    eval: dict[str, EvalProtocol] = field(default_factory=lambda: {
        "test": EvalProtocol(n=4, k=[1, 4], temperature=0.6, top_p=0.95, max_new_tokens=2048,
                             maj_k=[4])})


@register_task("geometry3k")
class Geometry3kTask(VariantTask):
    """Geometry3K problems with a diagram image (or its logic forms as text)."""

    offers: ClassVar[frozenset[str]] = frozenset({BINARY_CORRECT, IMAGES})  # harness.compat

    @classmethod
    def offers_for(cls, config: Any) -> frozenset[str]:
        """``full.mode=text`` gives the diagram's logic forms as text: no images."""
        if config.get("variant") == "full" and config.full.mode == "text":
            return cls.offers - {IMAGES}
        return cls.offers

    name = "geometry3k"

    @dataclass
    class Config:
        variant: str = "full"
        extraction: list[str] = field(default_factory=lambda: list(METHODS))
        correct_score: float = 1.0
        format_score: float = 0.0
        grader: GraderConfig = field(default_factory=GraderConfig)
        tiny: TinyConfig = field(default_factory=TinyConfig)
        full: FullConfig = field(default_factory=FullConfig)

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        check_methods(config.extraction)
        full = config.full
        render_prompt(full.template, "")  # fail early on an unknown template
        if full.mode not in MODES:
            raise ValueError(f"task.full.mode={full.mode!r} is not valid; valid: "
                             f"{', '.join(MODES)}")
        if full.source not in datasets.SOURCES:
            raise ValueError(f"task.full.source={full.source!r} is not valid; valid: "
                             f"{', '.join(datasets.SOURCES)}")
        if full.train_split not in ("auto", *datasets.SPLITS):
            raise ValueError(f"task.full.train_split={full.train_split!r} is not valid; valid: "
                             f"auto, {', '.join(datasets.SPLITS)}")
        if config.tiny.seed == config.tiny.eval_seed:
            raise ValueError("task.tiny.eval_seed must differ from task.tiny.seed (held-out "
                             "problems come from another generator seed)")
        valid = TINY_EVAL_SETS if config.variant == "tiny" else FULL_EVAL_SETS
        for key, proto in self._section.eval.items():
            if key not in valid:
                raise ValueError(f"task.{config.variant}.eval.{key} is not an eval set of "
                                 f"variant {config.variant!r}; valid: {', '.join(valid)}")
            if max([*proto.k, *(proto.maj_k or [])]) > proto.n:
                raise ValueError(f"task.{config.variant}.eval.{key}: every k must be <= n")
        self.grader = MathGrader(config.grader)
        self._train: list[Example] | None = None
        self._evals: dict[str, list[Example]] | None = None

    # -- data -----------------------------------------------------------------------------------
    def warmstart_examples(self) -> list[tuple[Example, str]]:
        """Tiny: every train problem with the generator's reference completion. Full: the
        format only (``\\boxed{letter}`` or ``\\boxed{value}``), no worked solutions."""
        train = self.train_examples()
        if self.config.variant == "tiny":
            return [(ex, ex.meta["reference"]) for ex in train]
        limit = max(self.config.full.warmstart_limit, 0)
        return [(ex, f"\\boxed{{{ex.answer['letter'] or ex.answer['value']}}}")
                for ex in train[:limit]]

    def _tiny_split(self) -> tuple[list[Example], dict[str, list[Example]]]:
        generated = importlib.import_module("tasks.geometry3k.generated")
        cfg = self.config.tiny
        if cfg.train_size < 1 or cfg.eval_size < 2:
            raise ValueError("task.tiny.train_size must be >= 1 and task.tiny.eval_size >= 2")
        train = [dataclasses.replace(ex, id=f"train/{ex.id}")
                 for ex in generated.generate(cfg.train_size, cfg.seed, cfg.image_size)]
        held = [dataclasses.replace(ex, id=f"heldout/{ex.id}")
                for ex in generated.generate(cfg.eval_size, cfg.eval_seed, cfg.image_size)]
        return train, {"generated": held,
                       "generated_shuffled": shuffle_images(held, cfg.shuffle_seed)}

    def _full_data(self) -> tuple[list[Example], dict[str, list[Example]]]:
        """Eval sets cut to their protocol's ``limit`` and the train pool cut to
        ``train_limit`` before any diagram is rendered or decoded; a problem in both is one
        Example."""
        cfg = self.config.full
        problems = {name: datasets.load(cfg.source, name, cfg.path) for name in cfg.eval}
        split = cfg.train_split
        if split == "auto":  # the bundled data has only the test split: RL on it is plumbing
            split = "test" if cfg.source == "bundled" else "train"
        pool = problems.get(split) or datasets.load(cfg.source, split, cfg.path)
        if cfg.train_limit is not None:
            pool = pool[: cfg.train_limit]
        made: dict[tuple[str, str], Example] = {}

        def example(p: datasets.Problem) -> Example:
            if (p.split, p.id) not in made:
                made[(p.split, p.id)] = self._example(p)
            return made[(p.split, p.id)]

        evals = {name: [example(p) for p in ps[: cfg.eval[name].limit]]
                 for name, ps in problems.items()}
        return [example(p) for p in pool], evals

    def _example(self, p: datasets.Problem) -> Example:
        cfg = self.config.full
        diagram_text = None
        images = None
        if cfg.mode == "text":
            if p.logic is None:
                raise ValueError(f"task.full.mode=text needs the Inter-GPS logic forms; problem "
                                 f"{p.id} ({p.split}) has none (only test ids 2401..3001 do)")
            diagram_text = logic.as_text(p.logic)
            kind = "logic_forms"
        elif p.image is not None:
            images, kind = [datasets.open_image(p.image)], "original"
        elif p.logic is not None:
            images = [lazy_png(render.diagram_png(p.logic, cfg.render_size))]
            kind = "rendered"
        else:
            raise ValueError(f"problem {p.id} ({p.split}) has neither a diagram nor an "
                             "annotation to render one from")
        text = prompt_text(p.text, p.choices, diagram_text)
        return Example(id=f"geometry3k-{p.id}", prompt=render_prompt(cfg.template, text),
                       images=images,
                       answer={"value": p.value, "choices": p.choices, "letter": p.letter},
                       meta={"problem_id": p.id, "split": p.split, "problem_text": p.text,
                             "diagram": kind})

    # -- verification ---------------------------------------------------------------------------
    def verify(self, example: Example, response: str) -> Score:
        return self.verify_batch([example], [response])[0]

    def verify_batch(self, examples: list[Example], responses: list[str]) -> list[Score]:
        """Extract every answer, grade letters directly and all values in one grader call."""
        parsed = []
        for ex, response in zip(examples, responses):
            answer, method = extract_answer(response, self.config.extraction)
            letter = choice_letter(answer, ex.answer.get("choices")) if answer else None
            parsed.append((answer, method, letter))
        todo = [i for i, (answer, _, letter) in enumerate(parsed)
                if answer is not None and letter is None]
        graded = self.grader.grade([(str(examples[i].answer["value"]), parsed[i][0])
                                    for i in todo])
        results = dict(zip(todo, graded))
        scores = []
        for i, (answer, method, letter) in enumerate(parsed):
            gold = examples[i].answer
            result = results.get(i)
            if letter is not None:
                correct = letter == gold.get("letter")
                status, key = "letter", gold["choices"][datasets.LETTERS.index(letter)]
            else:
                correct = bool(result and result.correct)
                status = result.status if result else "none"
                key = result.key if result and result.key is not None else answer
            reward = answer_reward(correct, answer is not None, self.config.correct_score,
                                   self.config.format_score)
            stats = grading_stats(method, status)
            stats["parse_letter"] = float(letter is not None)
            stats["parse_value"] = float(answer is not None and letter is None)
            scores.append(Score(reward=reward, correct=correct, parsed=answer is not None,
                                info={"extract": method, "answer": (answer or "")[:200],
                                      "letter": letter, "grade": status, "answer_key": key,
                                      "stats": stats}))
        return scores
