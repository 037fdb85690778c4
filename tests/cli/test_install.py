"""rlbench installed with a plain ``pip install`` (not editable) runs from any directory: the
configs ship as package data (``conf/``, found through ``importlib.resources``), and the git
lookups (a run's commit tag, a board's provenance) say ``unknown (not a git checkout: ...)`` in
one line outside a checkout instead of failing.

The slow test builds the checkout (tracked and untracked files, never ``build/`` or an old
``*.egg-info``) into a fresh venv without downloading anything: the venv reaches this
environment's dependencies through a ``.pth`` line naming its site-packages, whose own ``.pth``
files (the editable install's finder among them) are not run, and pip installs with
``--no-deps --no-build-isolation --no-index``. Then, from an empty directory outside the
checkout: ``rlbench list``, ``train``, ``sweep``, ``eval`` and ``board``. ``.ci/run`` does the same
with ``rlbench demo`` after the suite, from a real ``pip install .``.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import FAST_PRETRAIN, ROOT

# the smallest run that trains, evaluates and checkpoints (tests/helpers.QUIET_RUN, 2 steps)
TINY_RUN = [*FAST_PRETRAIN, "backend.threads=1", "data.prompts_per_step=4", "rollout.n=4",
            "task.tiny.eval.heldout.limit=8", "task.tiny.eval.heldout.n=4",
            "task.tiny.eval.heldout.k=[1,4]", "trainer.status_every=0"]
TINY_EVAL = ["backend.threads=1", "task.tiny.eval.heldout.limit=8", "task.tiny.eval.heldout.n=4",
             "task.tiny.eval.heldout.k=[1,4]"]


def _copy_checkout(dest: Path) -> None:
    """The checkout's files as a clone would have them plus untracked ones (``git ls-files``):
    no ``build/`` left by an earlier ``pip install .``, whose stale modules a wheel would ship."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True)
    if listed.returncode != 0:  # not a git checkout (an unpacked sdist): everything but outputs
        shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "rlbench-demo"))
        return
    for rel in filter(None, listed.stdout.split("\0")):
        src = ROOT / rel
        if src.is_file():  # a path deleted but not yet staged is still listed
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A fresh venv with the checkout installed into it, not editable; its ``bin`` and an empty
    working directory outside the checkout."""
    root = tmp_path_factory.mktemp("install")
    src, venv = root / "src", root / "venv"
    _copy_checkout(src)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    purelib = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True).stdout.strip())
    # the dependencies (and pip, setuptools) of this environment, as a plain sys.path entry
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (purelib / "_rlbench_test_deps.pth").write_text("".join(f"{p}\n" for p in deps))
    out = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps",
                          "--no-build-isolation", "--no-index", str(src)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    def configs(conf: Path) -> set[str]:
        return {p.relative_to(conf).as_posix() for p in conf.rglob("*") if p.is_file()
                and "__pycache__" not in p.parts}

    assert (purelib / "conf" / "config.yaml").is_file(), "conf/ is not shipped as package data"
    assert configs(purelib / "conf") == configs(src / "conf"), "a file under conf/ is not shipped"
    work = root / "work"
    work.mkdir()
    return {"venv": venv, "purelib": purelib, "work": work, "root": root}


def _env(installed: dict[str, Path]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "MLFLOW_TRACKING_URI", "RLBENCH_CACHE")}
    env["PATH"] = f"{installed['venv'] / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["RLBENCH_CACHE"] = str(installed["root"] / "cache")
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{installed['work'] / 'mlruns.db'}"
    env["GIT_CEILING_DIRECTORIES"] = str(installed["root"])  # never a repository above tmp
    return env


def _rlbench(installed: dict[str, Path], *args: str, cwd: Path | None = None,
             timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(installed["venv"] / "bin" / "rlbench"), *args],
                          cwd=cwd or installed["work"], env=_env(installed), capture_output=True,
                          text=True, timeout=timeout)


def _python(installed: dict[str, Path], code: str, cwd: Path) -> str:
    out = subprocess.run([str(installed["venv"] / "bin" / "python"), "-c", code], cwd=cwd,
                         env=_env(installed), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


@pytest.mark.slow
def test_a_plain_install_trains_sweeps_evaluates_and_builds_a_board_from_anywhere(installed):
    work, purelib = installed["work"], installed["purelib"]
    # the installed copy runs, not the checkout: no editable finder, conf/ from site-packages
    seen = json.loads(_python(installed, (
        "import json, sys, harness, conf; from harness.config import CONF_DIR; "
        "print(json.dumps([harness.__file__, str(CONF_DIR), "
        "[repr(f) for f in sys.meta_path if 'editable' in repr(f).lower()]]))"), work))
    assert Path(seen[0]).is_relative_to(purelib), seen
    assert Path(seen[1]) == purelib / "conf", seen
    assert seen[2] == [], seen

    listed = _rlbench(installed, "list", "algorithms")
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert "grpo" in listed.stdout

    train = _rlbench(installed, "train", "algorithm=grpo", "task=countdown", "model=tiny",
                     *TINY_RUN, "trainer.steps=2", "trainer.eval_every=2")
    assert train.returncode == 0, train.stderr[-3000:]
    assert "finished 2 steps" in train.stderr
    run_id = train.stderr.split("run id:")[1].split()[0]
    assert (work / "outputs").is_dir()  # relative outputs land in the working directory

    sweep = _rlbench(installed, "sweep", "seed=1,2", *TINY_RUN, "trainer.steps=2",
                     "trainer.eval_every=2", f"hydra.sweep.dir={work / 'multirun'}")
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    assert "(2 trained, 0 skipped" in sweep.stderr

    evaluated = _rlbench(installed, "eval", f"run_id={run_id}", *TINY_EVAL)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "heldout/pass_at_1" in evaluated.stdout

    board = _rlbench(installed, "board", "--out", "boards")
    assert board.returncode == 0, board.stderr[-3000:]
    page = (work / "boards" / "README.md").read_text()
    assert f"commit `unknown (not a git checkout: {work.resolve()})`" in page
    assert "Traceback" not in board.stderr + train.stderr + sweep.stderr

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{work / 'mlruns.db'}")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["rlbench.git_commit"] == "unknown"


@pytest.mark.slow
def test_an_installed_copy_takes_its_commit_from_the_working_directorys_checkout(installed):
    repo = installed["root"] / "project"
    repo.mkdir()
    (repo / "x.txt").write_text("x\n")
    for args in (["init", "-q"], ["add", "."],
                 ["-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "init"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()
    code = ("from harness.manifest import source_checkout, git_label; "
            "print(source_checkout(), git_label())")
    (repo / "sub").mkdir()
    assert _python(installed, code, repo / "sub") == f"{repo.resolve()} {head}"
    assert _python(installed, code, installed["work"]) == "None unknown"


def test_a_checkout_finds_its_configs_and_commit_from_any_directory(tmp_path):
    code = ("from harness.config import CONF_DIR; from harness.manifest import source_checkout; "
            "print(CONF_DIR); print(source_checkout())")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    conf, checkout = out.stdout.split()
    assert Path(conf) == ROOT / "conf"
    if (ROOT / ".git").exists():
        assert Path(checkout) == ROOT.resolve()


def test_outside_a_checkout_the_commit_is_one_line_not_a_failure(tmp_path, monkeypatch):
    from harness import manifest
    from harness.report import provenance

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(manifest, "source_checkout", lambda cwd=None: None)
    monkeypatch.setattr(provenance, "source_checkout", lambda cwd=None: None)
    assert manifest.git_state() == {"commit": None, "dirty": None, "branch": None}
    assert manifest.git_label() == "unknown"
    state = provenance.checkout(tmp_path / "boards")
    assert state == provenance.Checkout(f"unknown (not a git checkout: {tmp_path})", ())
    assert provenance.clean_checkout(tmp_path / "boards", allow_dirty=False) == state
