"""Rebuild committed leaderboards from their exported runs and print what differs.

For each board under ``leaderboards/`` that prints a Reproduce line (every ``rlbench board``
board; the LANTERN track has its own board and is left out), this runs, in a clean clone of
HEAD, the board command printed on it with ``--runs leaderboards/<board>`` (the exported
``runs.jsonl.gz`` beside its pages, loaded into a temporary MLflow store), then prints every
changed line of the rebuilt pages except those that say where and when a board was built
(``harness.report.provenance.BUILD_LINES``: tracking URI, command, board commit, date) and every
other changed file (PNG, CSV, export: git compares them byte for byte). No run is made: it
checks, in minutes instead of the sweeps' hours, that the committed pages are what the current
board code makes of the committed runs. Then it regenerates the claims ledger (``rlbench claims``:
docs/claims.md, read from every committed board page, the LANTERN track's included) in the same
clone and prints whether it changed; a changed ledger, like a changed board, exits 1.

    python benchmarks/rebuild_boards.py                     # every board
    python benchmarks/rebuild_boards.py code-tiny math-tiny # named boards
    python benchmarks/rebuild_boards.py --write             # and copy what changed back

``--write`` copies each changed board folder and the ledger from the clone into the working
tree, for a change of the board code: commit it, rebuild with ``--write``, commit the pages
(built at that commit), then run it again without ``--write`` to see every board unchanged.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.report.provenance import BUILD_LINES

ROOT = Path(__file__).resolve().parents[1]
LEDGER = "docs/claims.md"
FAILED = "failed: "  # a rebuild that did not run: reported, never written back


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


def rebuild(board: str, clone: Path) -> list[str]:
    """Rebuild ``board`` in ``clone``; return what changed beyond the build lines."""
    readme = clone / "leaderboards" / board / "README.md"
    text = readme.read_text() if readme.exists() else ""
    found = re.search(r"then `rlbench board ([^`]*)`", text)
    if found is None:
        return [f"{FAILED}no board with a Reproduce line at leaderboards/{board}/README.md"]
    command = found.group(1).split()
    done = subprocess.run([sys.executable, "-m", "harness.cli", "board", *command,
                           "--runs", f"leaderboards/{board}"],
                          cwd=clone, capture_output=True, text=True)
    if done.returncode:
        return [f"{FAILED}rlbench board exited {done.returncode}: {done.stderr.strip()[-500:]}"]
    where = ("--", f"leaderboards/{board}")
    diff = _git("diff", "-U0", *where, cwd=clone).splitlines()
    lines = [ln for ln in diff if ln[:1] in "+-" and not ln.startswith(("+++", "---"))
             and not BUILD_LINES.match(ln[1:])]
    # a changed page is in the diff above; anything else changed, or new, is listed
    others = [f"changed: {c}" for c in _git("status", "--short", *where, cwd=clone).splitlines()
              if not (c.startswith(" M") and c.endswith(".md"))]
    print(f"{board}: {len(lines)} changed lines, {len(others)} other files changed", flush=True)
    return lines + others


def rebuild_ledger(clone: Path) -> list[str]:
    """Regenerate the claims ledger in ``clone`` after its boards; return what changed."""
    done = subprocess.run([sys.executable, "-m", "harness.cli", "claims", "--out", LEDGER],
                          cwd=clone, capture_output=True, text=True)
    if done.returncode:
        return [f"{FAILED}rlbench claims exited {done.returncode}: "
                f"{done.stderr.strip()[-500:]}"]
    diff = _git("diff", "-U0", "--", LEDGER, cwd=clone).splitlines()
    lines = [ln for ln in diff if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    status = _git("status", "--short", "--", LEDGER, cwd=clone).strip()
    if status and not lines:  # not committed at HEAD: every line is new
        lines = [f"new: {LEDGER} (not committed at HEAD)"]
    print(f"{LEDGER}: {'changed, ' + str(len(lines)) + ' lines' if lines else 'unchanged'}",
          flush=True)
    return lines


def write_back(name: str, clone: Path, root: Path) -> None:
    """Copy ``name`` (a board folder under leaderboards/, or a file such as the ledger) from
    ``clone`` into ``root``: files the rebuild made or changed replace the committed ones."""
    src = clone / name if "/" in name else clone / "leaderboards" / name
    dst = root / src.relative_to(clone)
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dst)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("boards", nargs="*", help="board names (default: every board)")
    parser.add_argument("--write", action="store_true",
                        help="copy the changed boards and ledger back into the working tree")
    args = parser.parse_args(argv)
    boards = args.boards or sorted(
        p.parent.name for p in (ROOT / "leaderboards").glob("*/README.md")
        if "then `rlbench board " in p.read_text() and p.parent.name != "lantern")
    print(f"rebuilding at HEAD {_git('rev-parse', '--short', 'HEAD', cwd=ROOT).strip()} "
          "(uncommitted changes are not part of the check)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / "clone"
        _git("clone", "-q", str(ROOT), str(clone), cwd=ROOT)
        differs = {b: rebuild(b, clone) for b in boards}
        ledger = rebuild_ledger(clone)
        if args.write:
            changed = {**differs, LEDGER: ledger}
            for name in (n for n, lines in changed.items()
                         if lines and not lines[0].startswith(FAILED)):
                write_back(name, clone, ROOT)
                print(f"written: {name}", flush=True)
    for board, lines in [*differs.items(), (LEDGER, ledger)]:
        for line in lines[:20]:
            print(f"  {board}: {line[:200]}")
    same = [b for b, lines in differs.items() if not lines]
    print(f"{len(same)} of {len(boards)} boards rebuilt from their exports unchanged; "
          f"{LEDGER} {'changed' if ledger else 'unchanged'}")
    return 0 if len(same) == len(boards) and not ledger else 1


if __name__ == "__main__":
    sys.exit(main())
