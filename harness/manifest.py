"""The run manifest: everything needed to trace a number back to code, config and data."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

PACKAGES = ("rlbench", "torch", "transformers", "tokenizers", "mlflow", "hydra-core", "omegaconf",
            "numpy", "math-verify", "vllm", "megatron-core", "trl")


# git pathspec of what the harness generates rather than runs: a rewritten board is not a code
# change, for a training run's dirty flag or for a board's own checkout check
NOT_CODE = ":(exclude)leaderboards"


def _git_toplevel(path: Path) -> Path | None:
    """The top of the git work tree holding ``path``, or None (not in one, or no git)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=path,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    top = out.stdout.strip()
    return Path(top).resolve() if out.returncode == 0 and top else None


def source_checkout(cwd: Path | None = None) -> Path | None:
    """The git checkout whose commit names the code rlbench runs, or None outside one.

    1. The directory that holds the imported ``harness`` package, when it is the top of a git
       work tree: an editable install or a checkout on ``PYTHONPATH``. This holds from any
       working directory.
    2. Otherwise (``pip install .``: ``harness`` sits in ``site-packages``, which is never the top
       of a work tree even when a venv lives inside a clone) the git work tree around the
       working directory ``cwd``, if any: CI running an installed copy from its own clone, or a
       plugin project run from its repository.
    3. Otherwise None: provenance says ``unknown (not a git checkout: <cwd>)`` in one line, and
       the run's ``rlbench.git_commit`` tag is ``unknown``.
    """
    source = Path(__file__).resolve().parents[1]
    if _git_toplevel(source) == source:
        return source
    return _git_toplevel(Path.cwd() if cwd is None else cwd)


def not_a_checkout(cwd: Path | None = None) -> str:
    """The one line that stands for a commit outside any checkout (see :func:`source_checkout`)."""
    return f"unknown (not a git checkout: {Path.cwd() if cwd is None else cwd})"


def git_state(repo: Path | None = None) -> dict[str, Any]:
    """HEAD, whether tracked files differ from it (outside ``leaderboards/``) and the branch, of
    ``repo`` (default: :func:`source_checkout`); all None outside a checkout."""
    repo = repo or source_checkout()
    if repo is None:
        return {"commit": None, "dirty": None, "branch": None}

    def run(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                              timeout=10).stdout.strip()

    try:
        commit = run("rev-parse", "HEAD")
        dirty = bool(run("status", "--porcelain", "--untracked-files=no", "--", ".", NOT_CODE))
        branch = run("rev-parse", "--abbrev-ref", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None, "branch": None}
    return {"commit": commit or None, "dirty": dirty if commit else None,
            "branch": branch if commit and branch != "HEAD" else None}


def git_label(state: dict[str, Any] | None = None) -> str:
    """The run's code as one tag value: ``<commit>``, ``<commit>+dirty`` (tracked files differ
    from the commit), or ``unknown`` (not a git checkout)."""
    state = git_state() if state is None else state
    if not state.get("commit"):
        return "unknown"
    return state["commit"] + ("+dirty" if state.get("dirty") else "")


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu_label() -> str:
    """The CPU a run computed on, as far as it changes the numbers: its model name and the
    vector instruction set torch dispatches its kernels for (``AVX2``, ``AVX512``, ...). The
    same cell at the same commit on two CPUs starts from float-level different warm starts and
    trains along different paths (docs/suite.md, Machines), so every run is tagged with it."""
    import torch  # here, not at the top: the CLI's other commands need no torch

    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    return f"{name} / {torch.backends.cpu.get_cpu_capability()}"


def hardware() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu": cpu_label(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def build_manifest(cfg: Any, dataset_hash: str, model_path: str) -> dict[str, Any]:
    return {
        "git": git_state(),
        "command": sys.argv,
        "seed": cfg.seed,
        "config": OmegaConf.to_container(cfg, resolve=True),
        "dataset_hash": dataset_hash,
        "model_path": model_path,
        "packages": package_versions(),
        "hardware": hardware(),
    }
