"""Sweep cells: what makes two runs "the same experiment", and what to do when one already ran.

A *cell* is one resolved config (algorithm × task × model × seed × every other knob). Its
identity is :func:`config_hash`: the SHA-256 of the resolved config with the keys that cannot
change a result removed (where to log, where to write, how chatty, how many CPU threads). Every
training run carries it as the MLflow tag ``rlbench.config_hash``.

Before a cell trains, :func:`plan_cell` looks its hash up in the MLflow experiment:

* a FINISHED run with that hash -> skip (``trainer.skip_finished``, default on), so rerunning a
  sweep only runs the cells that did not finish;
* otherwise the newest KILLED / FAILED / RUNNING run with that hash that left a checkpoint ->
  continue it from that checkpoint into the same MLflow run (``trainer.resume=auto``, the
  default; ``true`` insists on it, ``false`` always starts afresh, a path resumes from there).
  A RUNNING run whose claim lapsed is one that died without saying so (SIGKILL, a lost node);
* otherwise -> a fresh run.

Before that lookup the cell is claimed in the store (:mod:`harness.claims`): while one process
trains a cell, another launch of it (a rerun command, a second cluster job) finds it busy and
does not train it; a claim whose process is gone is taken over (and its run resumed as above).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from harness.checkpoint import latest_checkpoint
from harness.claims import Claim, claim_cell
from harness.tracking import HASH_TAG  # the tag a finished cell is found by

# Keys that do not change what a run computes (dotted paths into the resolved config).
NON_SEMANTIC_KEYS = (
    "tracking",
    "trainer.output_dir",
    "trainer.resume",
    "trainer.skip_finished",
    "trainer.status_every",
    "backend.threads",  # these change float summation order only
    "backend.kv_cache",
    "backend.shared_prefix",
    "trainer.length_bucketing",
    "model.cache_dir",
)
RESUME_AUTO, RESUME_REQUIRED, RESUME_OFF = "auto", "true", "false"


def config_hash(cfg: Any) -> str:
    """16 hex digits of SHA-256 over the resolved config minus :data:`NON_SEMANTIC_KEYS` (and
    ``block_seed`` when it is null)."""
    data = OmegaConf.to_container(cfg, resolve=True) if not isinstance(cfg, dict) else dict(cfg)
    for dotted in NON_SEMANTIC_KEYS:
        *parents, leaf = dotted.split(".")
        node = data
        for key in parents:
            node = node.get(key, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(leaf, None)
    # an unset block_seed (the run is paired on its own seed) hashes as before the key existed,
    # so the runs made before it still skip their cells; a set one is part of the cell (an A/A
    # run is not the plain run of its seed, which a board would pair differently)
    if data.get("block_seed", 0) is None:
        data.pop("block_seed")
    blob = json.dumps(data, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def resume_mode(value: Any) -> str:
    """Normalise ``trainer.resume``: auto | true | false | a path."""
    if value is None:
        return RESUME_OFF
    text = str(value).strip()
    lowered = text.lower()
    if lowered in ("auto", ""):
        return RESUME_AUTO
    if lowered in ("true", "yes", "1"):
        return RESUME_REQUIRED
    if lowered in ("false", "no", "0", "none", "null"):
        return RESUME_OFF
    return text


@dataclass
class CellPlan:
    action: str  # "skip" | "busy" (another live process holds it) | "resume" | "fresh"
    config_hash: str
    run_id: str | None = None
    checkpoint: Path | None = None
    output_dir: Path | None = None
    reason: str = ""
    claim: Claim | None = None  # held while the cell trains; released when its run ends

    def release(self) -> None:
        if self.claim is not None:
            self.claim.release()

    def lost(self) -> bool:
        """Another process took the cell over (this one's heartbeat was presumed gone)."""
        return self.claim is not None and self.claim.lost.is_set()


def _runs_with_hash(client: Any, experiment_id: str, digest: str) -> list[Any]:
    runs = client.search_runs(
        [experiment_id], filter_string=f"tags.`{HASH_TAG}` = '{digest}'",
        order_by=["attributes.start_time DESC"], max_results=1000,
    )
    return [r for r in runs if r.data.tags.get("rlbench.kind", "train") == "train"]


def plan_cell(cfg: Any, client: Any | None, experiment_id: str | None,
              tracking_uri: str | None = None) -> CellPlan:
    """Claim the cell of ``cfg`` (with a store), then decide whether it is skipped, resumed or
    started afresh; a cell another live process holds is skipped."""
    digest = config_hash(cfg)
    claim = None
    if client is not None:
        held = claim_cell(client, experiment_id, digest, tracking_uri)
        if isinstance(held, str):
            return CellPlan("busy", digest, reason=f"cell {digest} is claimed by {held}, which "
                                                   "is training it")
        claim = held
    try:
        plan = _plan(cfg, client, experiment_id, digest)
    except BaseException:
        if claim is not None:
            claim.release()
        raise
    if plan.action == "skip" and claim is not None:
        claim.release()
    else:
        plan.claim = claim
    return plan


def _plan(cfg: Any, client: Any | None, experiment_id: str | None, digest: str) -> CellPlan:
    mode = resume_mode(cfg.trainer.resume)
    if mode not in (RESUME_AUTO, RESUME_REQUIRED, RESUME_OFF):  # an explicit checkpoint path
        path = latest_checkpoint(Path(mode))
        state = json.loads((path / "trainer_state.json").read_text())
        return CellPlan("resume", digest, state.get("run_id"), path, _output_dir_of(path),
                        reason=f"trainer.resume={mode}")
    runs = _runs_with_hash(client, experiment_id, digest) if client is not None else []
    if cfg.trainer.skip_finished:
        for run in runs:
            if run.info.status == "FINISHED":
                return CellPlan("skip", digest, run.info.run_id,
                                reason=f"run {run.info.run_id} FINISHED with config hash {digest} "
                                       "(trainer.skip_finished=false runs it again)")
    if mode != RESUME_OFF:
        for run in runs:
            if run.info.status == "FINISHED":
                continue
            out = run.data.tags.get("rlbench.output_dir")
            try:
                path = latest_checkpoint(Path(out)) if out else None
            except FileNotFoundError:
                path = None
            if path is not None:
                return CellPlan("resume", digest, run.info.run_id, path, Path(out),
                                reason=f"run {run.info.run_id} ended {run.info.status} "
                                       f"with a checkpoint at {path}")
        if mode == RESUME_REQUIRED:
            raise FileNotFoundError(
                f"trainer.resume=true: no unfinished run with config hash {digest} left a "
                "checkpoint in this experiment (use trainer.resume=<checkpoint or output dir>)"
            )
    return CellPlan("fresh", digest)


def _output_dir_of(checkpoint: Path) -> Path:
    """``<output_dir>/checkpoints/step_N`` -> ``<output_dir>``."""
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint
