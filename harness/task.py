"""The task protocol: data, prompt, verifier and evaluation protocol of one benchmark family.

A task is a class registered with ``@register_task(name)`` whose nested ``Config`` dataclass holds
every knob of ``conf/task/<name>.yaml`` (the config is validated against it, so a typo names the
key). The trainer uses only the methods below; everything else is the task's business.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

from harness.types import Example, Score


@dataclass
class EvalProtocol:
    """How one eval set is sampled and scored: ``n`` samples per problem at ``temperature``,
    reported as unbiased pass@k for every k in ``k`` (k <= n), mean@n and, when the task gives
    answer keys, maj@k for every k in ``maj_k`` (null: the ``k`` list; [] : none)."""

    n: int = 8
    k: list[int] = field(default_factory=lambda: [1, 8])
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 16
    limit: int | None = None  # evaluate only the first ``limit`` problems (None = all)
    maj_k: list[int] | None = None  # k of maj@k (None = the same as ``k``)


@dataclass
class EvalSet:
    name: str
    examples: list[Example]
    protocol: EvalProtocol


class Task:
    """Base class of every task. Subclasses set ``Config`` and implement the abstract methods."""

    Config: ClassVar[type]
    name: ClassVar[str] = ""
    # what the task offers its algorithms (harness.compat.CAPABILITIES): declared, not guessed
    offers: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, config: Any) -> None:
        self.config = config

    # -- data -----------------------------------------------------------------------------------
    def train_examples(self) -> list[Example]:
        """The pool RL prompts are drawn from."""
        raise NotImplementedError

    def eval_sets(self) -> list[EvalSet]:
        """Held-out sets evaluated every ``trainer.eval_every`` steps."""
        raise NotImplementedError

    def warmstart_examples(self) -> list[tuple[Example, str]]:
        """(problem, reference completion) pairs for supervised warm-start of a tiny model.
        The completion is the exact text the model should emit after the prompt (no EOS)."""
        raise NotImplementedError(f"task {self.name!r} has no warm-start data")

    @property
    def default_max_new_tokens(self) -> int:
        """Training-rollout length used when ``rollout.max_new_tokens`` is null."""
        raise NotImplementedError

    def tool_env(self) -> Any:
        """The tools a multi-turn task offers (a :class:`harness.tools.ToolEnv`), or None for a
        single-turn task (the default)."""
        return None

    # -- verification ---------------------------------------------------------------------------
    def verify(self, example: Example, response: str) -> Score:
        """Grade one response. Must never execute model output and never hang."""
        raise NotImplementedError

    def verify_batch(self, examples: list[Example], responses: list[str]) -> list[Score]:
        return [self.verify(e, r) for e, r in zip(examples, responses)]

    # -- provenance -----------------------------------------------------------------------------
    def dataset_hash(self) -> str:
        """sha256 over the train pool and every eval set, logged in the run manifest."""
        h = hashlib.sha256()
        for ex in self.train_examples():
            h.update(example_bytes(ex))
        for es in self.eval_sets():
            h.update(es.name.encode())
            for ex in es.examples:
                h.update(example_bytes(ex))
        return h.hexdigest()



class VariantTask(Task):
    """A task with a ``tiny`` (CPU testbed) and a ``full`` config section, chosen by
    ``config.variant``, whose ``_load()`` fills the train pool ``_train`` and the eval sets
    ``_evals`` (name -> examples) once; eval sets follow ``<section>.eval`` (name -> protocol),
    cut to each protocol's ``limit``."""

    VARIANTS = ("tiny", "full")

    _train: list[Example] | None = None
    _evals: dict[str, list[Example]] | None = None

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        if config.variant not in self.VARIANTS:
            raise ValueError(f"task.variant={config.variant!r} is not valid; valid variants: "
                             f"{', '.join(self.VARIANTS)}")

    @property
    def _section(self) -> Any:
        return self.config.tiny if self.config.variant == "tiny" else self.config.full

    @property
    def default_max_new_tokens(self) -> int:
        return int(self._section.max_new_tokens)

    def _load(self) -> None:
        if self._train is not None:
            return
        if self.config.variant == "tiny":
            self._train, self._evals = self._tiny_split()
        else:
            self._train, self._evals = self._full_data()

    def _tiny_split(self) -> tuple[list[Example], dict[str, list[Example]]]:
        raise NotImplementedError

    def _full_data(self) -> tuple[list[Example], dict[str, list[Example]]]:
        raise NotImplementedError

    def train_examples(self) -> list[Example]:
        self._load()
        assert self._train is not None
        return self._train

    def eval_sets(self) -> list[EvalSet]:
        self._load()
        assert self._evals is not None
        out = []
        for name, protocol in self._section.eval.items():
            examples = self._evals[name]
            if protocol.limit is not None:
                examples = examples[: protocol.limit]
            out.append(EvalSet(name=name, examples=examples, protocol=protocol))
        return out

def example_bytes(ex: Example) -> bytes:
    """The hashed content of one example: id, prompt, answer, the ids of a prompt cut to the
    model's limit (harness/prompts.py) and a digest of each image (the image's
    ``info["sha256"]`` when its loader set one, else sha256 of mode, size and pixels)."""
    payload: dict[str, Any] = {"id": ex.id, "prompt": ex.prompt, "answer": ex.answer}
    if ex.prompt_ids is not None:  # what the model is given is not the prompt text
        payload["prompt_ids"] = ex.prompt_ids
    if ex.images:
        payload["images"] = [_image_digest(im) for im in ex.images]
    return json.dumps(payload, sort_keys=True, default=str).encode()


def _image_digest(image: Any) -> str:
    info = getattr(image, "info", None)
    if isinstance(info, dict) and isinstance(info.get("sha256"), str):
        return info["sha256"]
    h = hashlib.sha256(f"{getattr(image, 'mode', '')}{getattr(image, 'size', '')}".encode())
    h.update(image.tobytes() if hasattr(image, "tobytes") else repr(image).encode())
    return h.hexdigest()
