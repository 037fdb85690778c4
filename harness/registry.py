"""One generic registry for every axis of rlbench.

Algorithms, tasks, advantage estimators, policy losses, rollout strategies, backends and models
are all looked up by name through a :class:`Registry`. A registry

* raises on a duplicate name, so two plugins cannot silently shadow each other;
* raises on an unknown name with the list of valid names and the closest match;
* accepts lazy ``"package.module:attr"`` entries, so heavy optional backends (vLLM, Megatron)
  are imported only when chosen;
* discovers third-party plugins through an entry-point group (``rlbench.algorithms``,
  ``rlbench.tasks``): loading the entry point imports the plugin module, whose decorators register.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from typing import Generic, TypeVar

T = TypeVar("T")


class RegistryError(KeyError):
    """A name that is unknown or registered twice. ``str()`` is the full message."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Name -> object (usually a class or a function), with lazy entries and plugins."""

    def __init__(self, kind: str, entry_point_group: str | None = None) -> None:
        self.kind = kind
        self.entry_point_group = entry_point_group
        self._entries: dict[str, T | str] = {}
        self._plugins_loaded = entry_point_group is None

    def register(self, name: str, obj: T | None = None) -> Callable[[T], T] | T:
        """Register ``obj`` under ``name``; without ``obj`` this is a decorator.

        ``obj`` may be a string ``"package.module:attr"``: it is imported on first ``get``.
        """
        if obj is not None:
            self._add(name, obj)
            return obj

        def decorator(target: T) -> T:
            self._add(name, target)
            return target

        return decorator

    def _add(self, name: str, obj: T | str) -> None:
        if not name or not isinstance(name, str):
            raise RegistryError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if name in self._entries:
            existing = self._entries[name]
            if existing is obj or _same_definition(existing, obj):
                return  # the same module imported twice (e.g. as a plugin and directly)
            if isinstance(existing, str) and existing == _spec_of(obj):
                self._entries[name] = obj  # a lazy entry's module imported: the object itself
                return
            raise RegistryError(
                f"{self.kind} {name!r} is already registered (by {_describe(existing)}); "
                f"cannot register {_describe(obj)} under the same name"
            )
        self._entries[name] = obj

    def get(self, name: str) -> T:
        self._load_plugins()
        if name not in self._entries:
            raise RegistryError(self._unknown_message(name))
        entry = self._entries[name]
        if isinstance(entry, str):
            entry = _import_lazy(entry, f"{self.kind} {name!r}")
            self._entries[name] = entry
        return entry

    def names(self) -> list[str]:
        self._load_plugins()
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load_plugins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def _unknown_message(self, name: str) -> str:
        valid = self.names()
        close = difflib.get_close_matches(str(name), valid, n=1, cutoff=0.5)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        return f"unknown {self.kind} {name!r}.{hint} Valid names: {', '.join(valid) or '(none)'}"

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        for ep in entry_points(group=self.entry_point_group):
            try:
                ep.load()
            except Exception as exc:  # a broken plugin must name itself, not break silently
                raise RegistryError(
                    f"plugin {ep.name!r} ({ep.value}) in entry-point group "
                    f"{self.entry_point_group!r} failed to import: {exc!r}"
                ) from exc


def _import_lazy(spec: str, what: str) -> object:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(
            f"{what} needs module {module_name!r}, which failed to import ({exc}). "
            "GPU backends need the extra: pip install -e '.[gpu]'"
        ) from exc
    return getattr(module, attr) if attr else module


def _same_definition(a: object, b: object) -> bool:
    """True when two objects are the same definition reloaded (same module and qualname)."""
    return (
        getattr(a, "__module__", None) is not None
        and getattr(a, "__module__", None) == getattr(b, "__module__", None)
        and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None)
    )


def _spec_of(obj: object) -> str | None:
    """``"module:qualname"`` of a definition, the form of a lazy entry; None for a string."""
    if isinstance(obj, str):
        return None
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', '?')}"


def _describe(obj: object) -> str:
    if isinstance(obj, str):
        return obj
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


# The axes. Building blocks are registered by the modules that define them.
ALGORITHMS: Registry = Registry("algorithm", entry_point_group="rlbench.algorithms")
TASKS: Registry = Registry("task", entry_point_group="rlbench.tasks")
# Building blocks live in algorithm modules, so they are discovered through the same group.
ADVANTAGES: Registry = Registry("advantage estimator", entry_point_group="rlbench.algorithms")
POLICY_LOSSES: Registry = Registry("policy loss", entry_point_group="rlbench.algorithms")
ROLLOUTS: Registry = Registry("rollout strategy", entry_point_group="rlbench.algorithms")
# Reward rules by name (``task=custom task.reward.verifier=<name>``): factories
# ``(options: dict) -> verify_batch(examples, responses) -> list[Score]``. The engine's own (math,
# exact_match) live in harness.verifiers; tasks register theirs (countdown, code_tests), found
# through the tasks' entry-point group, so a task never imports another task.
VERIFIERS: Registry = Registry("verifier", entry_point_group="rlbench.tasks")
VERIFIERS.register("math", "harness.verifiers:MathVerifier")
VERIFIERS.register("exact_match", "harness.verifiers:ExactMatchVerifier")
BACKENDS: Registry = Registry("backend")
MODELS: Registry = Registry("model")
# Tracks outside the LLM training loop (``rlbench train|sweep track=<name>``, ``rlbench board
# --track <name>``): an object with ``run_hydra(overrides, multirun)`` and ``build_board(uri,
# experiment, out, log_to_mlflow)``. Lazy, so the harness never imports a track it does not run.
TRACKS: Registry = Registry("track", entry_point_group="rlbench.tracks")
TRACKS.register("lantern", "lantern.track:TRACK")


def register_algorithm(name: str) -> Callable[[T], T]:
    return ALGORITHMS.register(name)


def register_task(name: str) -> Callable[[T], T]:
    return TASKS.register(name)


def register_advantage(name: str) -> Callable[[T], T]:
    return ADVANTAGES.register(name)


def register_policy_loss(name: str) -> Callable[[T], T]:
    return POLICY_LOSSES.register(name)


def register_rollout(name: str) -> Callable[[T], T]:
    return ROLLOUTS.register(name)


def register_verifier(name: str) -> Callable[[T], T]:
    return VERIFIERS.register(name)
