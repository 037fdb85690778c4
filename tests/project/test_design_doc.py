"""The docs name only what exists, and every page can be found.

* docs/design.md: every file and folder of its Layout tree, every repository path and module it
  names in the text, and every config key it names (as in docs/configuration.md) exists; and
  its Layout names every module of harness/, lantern/ and algorithms/ and every task package;
* docs/index.md links every page under docs/;
* every relative link (and image) in README.md and docs/ points at a file of the repository.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.config import compose_config

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
DESIGN = DOCS / "design.md"
KEY_PAGES = [DESIGN, DOCS / "configuration.md"]

FENCE = re.compile(r"^```.*?^```[^\n]*$", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")
TOP_DIRS = ("harness", "algorithms", "tasks", "lantern", "conf", "benchmarks", "tests",
            "examples", "leaderboards", "docs")
REPO_PATH = re.compile(rf"^(?:{'|'.join(TOP_DIRS)})/[\w./<>*-]*$")
MODULE = re.compile(r"^(?:harness|algorithms|tasks|lantern)(?:\.\w+)+$")
KEY_ROOTS = ("seed", "algorithm", "task", "model", "backend", "trainer", "data", "rollout",
             "tracking")
CONFIG_KEY = re.compile(rf"^(?:{'|'.join(KEY_ROOTS)})\.[\w.<>*]+$")
LINK = re.compile(r"!?\[(?:[^\]`]|`[^`]*`)*\]\(([^)\s]+)\)")
IMG = re.compile(r"<img\s[^>]*src=\"([^\"]+)\"")


def prose(text: str) -> str:
    """The page without its fenced code blocks."""
    return FENCE.sub("", text)


# ---------------------------------------------------------------------------------- layout tree

def layout_block(text: str) -> str:
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```\n(.*?)```", section, re.S).group(1)


NAMES = re.compile(r"^([\w.][\w./-]*(?:, [\w.][\w./-]*)*)(?:\s{2,}|$)")


def layout_paths(block: str) -> list[str]:
    """The repository paths a layout tree names: two-space indentation nests a line under the
    nearest folder (``name/``) above it with less indentation; a line may name several
    entries (``a.py, b.py   what they do``); the description follows two or more spaces."""
    paths: list[str] = []
    parents: list[tuple[int, str]] = []  # (indent, folder path ending in /)
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        match = NAMES.match(line.strip())
        assert match, f"layout line names no file or folder: {line!r}"
        names = match.group(1).split(", ")
        while parents and parents[-1][0] >= indent:
            parents.pop()
        prefix = parents[-1][1] if parents else ""
        paths.extend(prefix + name for name in names)
        if len(names) == 1 and names[0].endswith("/"):
            parents.append((indent, prefix + names[0]))
    return paths


def missing_paths(paths: list[str]) -> list[str]:
    return sorted(p for p in paths if not (ROOT / p).exists())


def test_layout_parser_nests_by_indentation():
    block = "a/  top\n  b.py, c/   two\n  d/  sub\n    e.py  deep\n  f.py\ng.toml  x\n"
    assert layout_paths(block) == ["a/", "a/b.py", "a/c/", "a/d/", "a/d/e.py", "a/f.py",
                                   "g.toml"]


def test_every_file_and_folder_in_the_design_layout_exists():
    paths = layout_paths(layout_block(DESIGN.read_text()))
    assert len(paths) > 50 and "harness/trainer.py" in paths
    absent = missing_paths(paths)
    assert not absent, f"docs/design.md's Layout names what does not exist: {absent}"


def test_the_design_layout_names_every_module_of_the_engine():
    """A module added to ``harness/`` or ``lantern/``, a sub-package of ``harness/``, an
    algorithm module or a task package appears in the layout (design.md stays current)."""
    paths = set(layout_paths(layout_block(DESIGN.read_text())))
    expected = [*(p for d in ("harness", "lantern", "algorithms")
                  for p in sorted((ROOT / d).glob("*.py")) if p.name != "__init__.py"),
                *(p for d in ("harness", "tasks") for p in sorted((ROOT / d).iterdir())
                  if p.is_dir() and (p / "__init__.py").exists())]
    names = [str(p.relative_to(ROOT)) + ("/" if p.is_dir() else "") for p in expected]
    unnamed = sorted(n for n in names if n not in paths)
    assert not unnamed, f"docs/design.md's Layout leaves out: {unnamed}"


# ------------------------------------------------------------------- paths and modules in text

def named_repo_paths(text: str) -> list[str]:
    """Backticked repository paths (``harness/trainer.py``, ``conf/algorithm/``); a
    placeholder (``conf/algorithm/<name>.yaml``, ``docs/*.md``) is checked up to its folder."""
    out = []
    for token in INLINE.findall(prose(text)):
        token = token.split()[0] if token.split() else token
        if not REPO_PATH.match(token):
            continue
        if re.search(r"[<*]", token):
            token = re.split(r"[<*]", token)[0].rsplit("/", 1)[0] + "/"
        out.append(token)
    return out


def module_exists(dotted: str) -> bool:
    """``harness.report.stats`` is a module; ``harness.summary.final_metrics`` an attribute
    defined at the top of a module."""
    parts = dotted.split(".")
    if (ROOT.joinpath(*parts).with_suffix(".py")).exists() or ROOT.joinpath(*parts).is_dir():
        return True
    module = ROOT.joinpath(*parts[:-1])
    source = module.with_suffix(".py") if module.with_suffix(".py").exists() \
        else module / "__init__.py"
    if not source.exists():
        return False
    defined = rf"^(?:class |def |async def )?{re.escape(parts[-1])}\b"
    return re.search(defined, source.read_text(), re.M) is not None


@pytest.mark.parametrize("page", KEY_PAGES, ids=lambda p: p.name)
def test_every_path_and_module_a_page_names_exists(page):
    text = page.read_text()
    absent = missing_paths(named_repo_paths(text))
    assert not absent, f"{page.name} names paths that do not exist: {absent}"
    modules = [t for t in INLINE.findall(prose(text)) if MODULE.match(t)]
    unknown = sorted(m for m in modules if not module_exists(m))
    assert not unknown, f"{page.name} names modules that do not exist: {unknown}"


# ------------------------------------------------------------------------------- config keys

def flat_keys(node, prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for key, value in node.items_ex(resolve=False) if hasattr(node, "items_ex") else node.items():
        path = f"{prefix}{key}"
        keys.add(path)
        if OmegaConf.is_dict(value):
            keys |= flat_keys(value, path + ".")
    return keys


@functools.cache
def config_keys() -> frozenset[str]:
    """Every key of the composed default config, and of the configs that add keys of their own
    (``task=custom``'s columns and reward, ``model=hf``), with and without a recipe."""
    keys: set[str] = set()
    for overrides in ([], ["task=custom"], ["model=hf"]):
        keys |= flat_keys(compose_config(overrides))
    return frozenset(keys)


def named_keys(text: str) -> list[str]:
    """Backticked config keys (``trainer.eval_every``); a placeholder or wildcard
    (``task.eval.<name>.*``, ``task.reward.*``) is checked up to it."""
    out = []
    for token in INLINE.findall(prose(text)):
        for part in re.split(r",\s*", token):
            part = part.strip()
            if "=" in part or "(" in part or "/" in part:
                continue
            if not CONFIG_KEY.match(part):
                continue
            out.append(re.split(r"\.(?:<|\*)", part)[0])
    return out


def test_named_keys_are_read_with_their_placeholders_cut():
    text = "`trainer.eval_every`, `task.eval.<name>.*`, `data.x=1`, `a.b`\n```\n`rollout.q`\n```"
    assert named_keys(text) == ["trainer.eval_every", "task.eval"]


@pytest.mark.parametrize("page", KEY_PAGES, ids=lambda p: p.name)
def test_every_config_key_a_page_names_is_a_key_of_the_config(page):
    keys = named_keys(page.read_text())
    assert keys, f"{page.name} names no config key: the parser is wrong"
    unknown = sorted(set(keys) - config_keys())
    assert not unknown, f"{page.name} names config keys that do not exist: {unknown}"


# ------------------------------------------------------------------------- index and links

PAGES = sorted(DOCS.rglob("*.md"))


def relative_links(page: Path) -> list[str]:
    text = prose(page.read_text())
    links = LINK.findall(text) + IMG.findall(text)
    return [link for link in links
            if not re.match(r"^[a-z][a-z0-9+.-]*:", link) and not link.startswith("#")]


def resolve(page: Path, link: str) -> Path:
    return (page.parent / link.split("#", 1)[0]).resolve()


def test_the_index_links_every_page_of_docs():
    index = DOCS / "index.md"
    linked = {resolve(index, link) for link in relative_links(index)}
    unlisted = sorted(str(p.relative_to(ROOT)) for p in PAGES
                      if p != index and p.resolve() not in linked)
    assert not unlisted, f"docs/index.md does not link: {unlisted}"


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    links = relative_links(page)
    broken = sorted(link for link in links if not resolve(page, link).exists())
    assert not broken, f"{page.relative_to(ROOT)} links to what does not exist: {broken}"
