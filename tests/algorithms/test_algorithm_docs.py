"""The algorithm pages (docs/algorithms/) name only code that exists: every backticked CamelCase
name is a class defined in the repository (or a Python builtin), and every backticked
``<dir>/<file>.py`` path is a file of the repository."""

from __future__ import annotations

import builtins
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs" / "algorithms").glob("*.md"))
CAMEL = re.compile(r"`([A-Z][a-z0-9]+[A-Z][A-Za-z0-9_]*)`")
PATH = re.compile(r"`((?:algorithms|harness|tasks|lantern|tests|benchmarks)/[\w/]+\.py)`")


CODE_DIRS = ("algorithms", "harness", "tasks", "lantern", "benchmarks", "examples", "tests")


@functools.cache
def defined_classes() -> frozenset[str]:
    names: set[str] = set()
    for folder in CODE_DIRS:
        for py in (ROOT / folder).rglob("*.py"):
            names.update(re.findall(r"^\s*class (\w+)", py.read_text(), re.M))
    return frozenset(names)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_algorithm_page_names_only_existing_code(page):
    text = page.read_text()
    known = defined_classes() | set(dir(builtins))
    missing = sorted(set(CAMEL.findall(text)) - known)
    assert not missing, f"{page.name} names classes that do not exist: {missing}"
    absent = sorted(p for p in set(PATH.findall(text)) if not (ROOT / p).exists())
    assert not absent, f"{page.name} names files that do not exist: {absent}"
