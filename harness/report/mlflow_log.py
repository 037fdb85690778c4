"""Leaderboards browsable in MLflow: one run per (task, task variant, model) in the experiment the
leaderboard was built from, tagged ``rlbench.kind=leaderboard`` (so ``rlbench board`` and the
sweep's finished-cell check never mistake it for a training run).

Each run holds the table as an MLflow table artifact (``leaderboard_table.json``, viewable in the
UI's artifact view and loadable with ``MlflowClient.load_table``), the markdown and CSV pages, the
PNG curves, ``runs.json`` (the training runs behind each row), the export of those runs
(``runs.jsonl.gz``) and a tag per row listing them (``rlbench.leaderboard.runs.<row>`` =
``seed:run_id,...``). A board with a selection (the learning-rate protocol) also records, per row,
the grid and the choice: ``rlbench.leaderboard.selection.<row>`` = ``value:mean,...|chosen``
(the mean of the selection metric over seeds at each value), and the params ``select.key`` and
``select.metric``. Rebuilding a leaderboard replaces its
run: the new run is logged completely first, then the previous leaderboard runs of the same group
are deleted (MLflow's soft delete; ``mlflow gc`` purges them), so a failed rebuild leaves the old
one in place.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

from mlflow.entities import Param, RunTag, ViewType
from mlflow.tracking import MlflowClient

__all__ = ["KIND_TAG", "LEADERBOARD", "log_leaderboard", "row_tag", "selection_tag"]

KIND_TAG = "rlbench.kind"
LEADERBOARD = "leaderboard"
TABLE_FILE = "leaderboard_table.json"
_MAX_TAG = 8000  # MLflow's tag value limit
_MAX_PARAM = 6000
_TEXT_COLUMNS = {"row", "algorithm", "variant", "temperature", "selected", "baseline",
                 "baseline_via", "seeds", "run_ids"}


def row_tag(row_key: str) -> str:
    """The tag listing a row's runs; MLflow keys allow letters, digits, ``_ - . / :`` and space."""
    return "rlbench.leaderboard.runs." + re.sub(r"[^\w.\-/: ]", "_", row_key)


def selection_tag(row_key: str) -> str:
    """The tag holding a row's selection grid and choice."""
    return "rlbench.leaderboard.selection." + re.sub(r"[^\w.\-/: ]", "_", row_key)


def _typed(records: list[dict[str, str]]) -> dict[str, list]:
    """Columns of the CSV records, numeric ones as floats (nan where missing)."""
    cols: dict[str, list] = {name: [] for name in (records[0] if records else {})}
    for rec in records:
        for name, value in rec.items():
            if name in _TEXT_COLUMNS:
                cols[name].append(value)
                continue
            try:
                cols[name].append(float(value))
            except ValueError:
                cols[name].append(value)
    return cols


def _previous(client: MlflowClient, exp_id: str, group_tags: dict[str, str]) -> list[str]:
    found, token = [], None
    while True:
        page = client.search_runs([exp_id], filter_string=f"tags.`{KIND_TAG}` = '{LEADERBOARD}'",
                                  run_view_type=ViewType.ACTIVE_ONLY, max_results=1000,
                                  page_token=token)
        found += [r.info.run_id for r in page
                  if all(r.data.tags.get(k) == v for k, v in group_tags.items())]
        token = page.token
        if not token:
            return found


def log_leaderboard(client: MlflowClient, exp_id: str, *, name: str, group_tags: dict[str, str],
                    files: Sequence[Path], records: list[dict[str, str]],
                    row_runs: dict[str, list[tuple[str, str]]], info: dict[str, str],
                    note: str, selection: dict[str, str] | None = None) -> str:
    """Log one leaderboard as a FINISHED run, then delete the group's previous leaderboard runs.

    ``group_tags``: the tags identifying the group (task, variant, model); ``files``: the
    markdown, CSV and PNGs; ``records``: the CSV rows (the MLflow table); ``row_runs``: row key
    -> [(seed, run id)]; ``info``: extra params (experiment, command, ...); ``note``: the run's
    description (markdown shown on the run page); ``selection``: row key -> its grid and
    choice (``value:mean,...|chosen``). Returns the new run's id."""
    old = _previous(client, exp_id, group_tags)
    all_ids = [rid for runs in row_runs.values() for _, rid in runs]
    tags = {KIND_TAG: LEADERBOARD, **group_tags,
            "mlflow.note.content": note if len(note) <= _MAX_TAG
            else note[: _MAX_TAG - 60].rsplit("\n", 1)[0] + "\n\n(truncated: see leaderboard.md)"}
    for key, runs in row_runs.items():
        value = ",".join(f"{seed}:{rid}" for seed, rid in runs)
        tags[row_tag(key)] = value if len(value) <= _MAX_TAG else "(see runs.json)"
    for key, value in (selection or {}).items():
        tags[selection_tag(key)] = value[:_MAX_TAG]
    joined = ",".join(all_ids)
    tags["rlbench.leaderboard.source_runs"] = joined if len(joined) <= _MAX_TAG \
        else "(see runs.json)"
    run = client.create_run(exp_id, run_name=name, tags=tags)
    run_id = run.info.run_id
    try:
        client.log_batch(run_id, params=[Param(k, str(v)[:_MAX_PARAM])
                                         for k, v in sorted(info.items())],
                         tags=[RunTag("rlbench.leaderboard.rows", str(len(row_runs)))])
        client.log_table(run_id, data=_typed(records), artifact_file=TABLE_FILE)
        for path in files:
            client.log_artifact(run_id, str(path))
        with tempfile.TemporaryDirectory() as tmp:
            target = Path(tmp) / "runs.json"
            target.write_text(json.dumps(
                {key: [{"seed": s, "run_id": rid} for s, rid in runs]
                 for key, runs in row_runs.items()}, indent=2) + "\n")
            client.log_artifact(run_id, str(target))
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED")
    for rid in old:
        client.delete_run(rid)
    return run_id

