"""Where a board's numbers come from: the checkout it is built in, the tracking URI it may show,
and an export of the MLflow runs behind it.

- :func:`checkout` - HEAD and the paths that differ from it. ``rlbench board`` refuses to build
  from a checkout with uncommitted changes (outside ``leaderboards/`` and its own output)
  unless ``--allow-dirty``, and then says so on every page.
- :func:`reproduce` - the two commands that rebuild a board, when every run behind it was
  launched by a named sweep (tag ``rlbench.sweep``; several, e.g. a testbed's and its controls',
  are run one after another) with no override its sweep does not make itself (tag
  ``rlbench.overrides``: the cell's swept values, and keys that cannot change a result, such as
  the launcher or thread counts, are fine); otherwise why not.
- :func:`export_runs` writes ``runs.jsonl.gz`` next to a board: one JSON line per run behind
  it (run info, tags, params and every metric's full history; no artifacts), sorted and gzipped
  without a timestamp, so an unchanged store exports the same bytes. :func:`import_runs` loads
  such a file into a fresh MLflow store (each run tagged with its original id,
  ``rlbench.exported_run_id``, which the board shows instead of the new one), so
  ``rlbench board ... --runs leaderboards/<name>`` (a file or a board folder; a temporary
  store) rebuilds the board from the committed export alone. :data:`BUILD_LINES` are the page
  lines such a rebuild may change (where and when the board was built).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import re
import subprocess
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from harness.cell_plan import NON_SEMANTIC_KEYS
from harness.config import CONF_DIR
from harness.manifest import NOT_CODE, not_a_checkout, source_checkout
from harness.report.collect import EXPORTED_ID_TAG
from harness.report.config import BoardError
from harness.report.metric_rows import is_database, read_histories, write_histories
from harness.report.tables import Run
from harness.tracking import open_client

__all__ = ["BUILD_LINES", "Checkout", "checkout", "clean_checkout", "display_tracking_uri",
           "export_runs", "import_runs", "reproduce"]

# The checkout a board's commit and dirty paths are read from. None: harness.manifest's
# source_checkout() at each call (the package's own clone, else the working directory's);
# tests pin a repository here.
REPO: Path | None = None
_SECRET_RE = re.compile(r"pass|secret|token|key|cred|auth|sig", re.IGNORECASE)
_BATCH = 1000  # MLflow's log_batch limit on metrics
# The page lines that say where and when a board was built; a rebuild from the same runs with the
# same code changes nothing else.
BUILD_LINES = re.compile(
    r"^(- Tracking URI:|- Command:|- Board built at commit|- Date:|  - made by) ")


@dataclass(frozen=True)
class Checkout:
    commit: str  # HEAD, or "unknown (not a git checkout: <working directory>)"
    dirty: tuple[str, ...]  # changed or untracked paths outside the excluded outputs

    def describe(self, allowed: bool) -> str:
        if not self.dirty:
            return self.commit
        return (f"{self.commit} (with uncommitted changes to {len(self.dirty)} path(s), built "
                f"with --allow-dirty: the board may not match this commit)" if allowed else
                f"{self.commit} (with uncommitted changes)")


def checkout(out: Path) -> Checkout:
    """HEAD of the checkout rlbench runs from, and the paths (tracked and modified, or untracked
    and not ignored) that differ from it, leaving out ``leaderboards/`` and ``out`` (boards
    written before this one, and this one). Which checkout: :func:`harness.manifest.
    source_checkout`; outside any, the commit is one line saying so and nothing is dirty."""
    repo = REPO if REPO is not None else source_checkout()
    if repo is None:
        return Checkout(not_a_checkout(), ())

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                              check=True, timeout=30).stdout

    try:
        head = git("rev-parse", "HEAD").strip()
        exclude = [NOT_CODE]
        with contextlib.suppress(ValueError):  # ``out`` outside the checkout: nothing to exclude
            exclude.append(f":(exclude){out.resolve().relative_to(repo).as_posix()}")
        status = git("status", "--porcelain", "--", ".", *exclude)
    except (OSError, subprocess.SubprocessError):
        return Checkout(f"unknown (git could not read a commit in {repo})", ())
    return Checkout(head, tuple(sorted(line[3:] for line in status.splitlines() if line)))


def clean_checkout(out: Path, allow_dirty: bool) -> Checkout:
    """:func:`checkout`, refused (:class:`BoardError`, exit 2) when it has uncommitted changes
    unless ``allow_dirty``: a board names the code it was built with."""
    state = checkout(out)
    if state.dirty and not allow_dirty:
        shown = ", ".join(state.dirty[:5]) + (", ..." if len(state.dirty) > 5 else "")
        raise BoardError(f"the checkout has uncommitted changes ({len(state.dirty)} path(s): "
                         f"{shown}); commit them so the board names the code it was built "
                         "with, or pass --allow-dirty (the board then says so)")
    return state


def _rel_or_name(path: str, base: Path) -> str:
    p = Path(path).expanduser().resolve()
    try:
        return p.relative_to(base.resolve()).as_posix()
    except ValueError:
        return p.name


def display_tracking_uri(uri: str, base: Path) -> str:
    """``uri`` safe to publish: credentials and secret-looking query parameters removed; a
    local store (sqlite, file) shown relative to ``base`` when under it, else by basename."""
    if uri.startswith("sqlite:"):
        path = uri[len("sqlite:///") :].split("?", 1)[0] if uri.startswith("sqlite:///") else ""
        return "sqlite:///" + _rel_or_name(path, base) if path else "sqlite://"
    parts = urlsplit(uri)
    if parts.scheme in ("", "file"):
        return _rel_or_name(parts.path if parts.scheme else uri, base)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if not _SECRET_RE.search(k)])
    return urlunsplit((parts.scheme, host, parts.path, query, ""))


# ---------------------------------------------------------------------------------- reproduce

def _sweep_params(name: str) -> dict[str, set[str]] | None:
    path = CONF_DIR / "sweep" / f"{name}.yaml"
    if not path.is_file():
        return None
    from omegaconf import OmegaConf

    params = OmegaConf.select(OmegaConf.load(path), "hydra.sweeper.params") or {}
    return {str(k): {v.strip() for v in str(vals).split(",")} for k, vals in params.items()}


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _swept(value: str, values: set[str]) -> bool:
    """Is ``value`` one the sweep makes? Hydra writes a swept ``1e-4`` back as ``0.0001``, so
    numbers compare as numbers."""
    number = _number(value)
    return value in values or (number is not None and number in {_number(v) for v in values})


def _harmless(key: str) -> bool:
    """Overrides that cannot change a result: the launcher, Hydra itself, where a run logs."""
    return key.startswith(("hydra", "hydra/")) or any(
        key == k or key.startswith(k + ".") for k in NON_SEMANTIC_KEYS)


def reproduce(runs: list[Run], board_cmd: str, driver: str | None = None,
              chosen: str | None = None) -> str:
    """The "Reproduce" line of a board built from ``runs``. A board whose rows sit at a value
    chosen per row (the selection key ``chosen``, e.g. ``trainer.optim.lr``) is reproduced by its
    config's ``driver`` command (which runs the tuning sweep, then the named sweep at each row's
    choice) instead of one ``rlbench sweep``; overrides of ``chosen`` are then expected."""
    sweeps = Counter(r.sweep for r in runs)
    named = sorted(s for s in sweeps if s)
    if not named or sweeps.get("", 0):
        missing = sweeps.get("", 0)
        return ("- Reproduce: not by two commands: runs came from "
                + (", ".join(f"sweep `{s}` ({sweeps[s]})" for s in named) or "no named sweep")
                + (f" and {missing} run(s) not launched by a named sweep" if missing and named
                   else "") + ".")
    # several named sweeps into one experiment (a testbed's and its controls'): each reproduces
    # its own runs, so the board is their sweeps run one after another
    for sweep in named:
        params = _sweep_params(sweep)
        if params is None:
            return f"- Reproduce: not by two commands: sweep `{sweep}` is not in conf/sweep/."
        extra: Counter[str] = Counter()
        unknown = 0
        for run in runs:
            if run.sweep != sweep:
                continue
            if run.overrides is None:
                unknown += 1
                continue
            for override in run.overrides:
                key, _, value = override.lstrip("+~").partition("=")
                if key == "sweep" or _harmless(key) or _swept(value, params.get(key, set())) \
                        or (driver and key == chosen):
                    continue
                extra[override] += 1
        if extra or unknown:
            why = [f"`{o}` ({n})" for o, n in sorted(extra.items())]
            why += [f"{unknown} run(s) did not record their overrides"] if unknown else []
            return (f"- Reproduce: not by two commands: runs of sweep `{sweep}` had overrides "
                    f"it does not make: {', '.join(why)}.")
    first = f"`{driver}`" if driver else " and ".join(f"`rlbench sweep sweep={s}`"
                                                       for s in named)
    return (f"- Reproduce ({where(getattr(r, 'commit', '') for r in runs)}): "
            f"{first}, then `{board_cmd}`.")


def where(commits: Iterable[str]) -> str:
    """Where a board's two commands reproduce it: the repository root, at the runs' commit when
    they share one clean commit (at another commit the code, and so the numbers, may differ)."""
    seen = set(commits)
    if len(seen) == 1 and (sha := seen.pop()) and "+" not in sha:
        return f"from the repository root, at the runs' commit `{sha[:12]}`"
    return "from the repository root"


# ---------------------------------------------------------------------------------- export

def _histories(client: MlflowClient, run_id: str, keys: Iterable[str]) -> dict[str, list]:
    """Every metric history of a run, each in ``get_metric_history``'s order: in one query on a
    database-backed store (harness/report/metric_rows.py), else one call per key."""
    uri = str(client.tracking_uri)
    if is_database(uri):
        return read_histories(uri, run_id)
    return {key: [(m.step, m.value, m.timestamp) for m in client.get_metric_history(run_id, key)]
            for key in keys}


def _record(client: MlflowClient, run_id: str) -> dict:
    run = client.get_run(run_id)
    histories = _histories(client, run_id, run.data.metrics)
    metrics = {}
    for key in sorted(run.data.metrics):
        hist = sorted(histories.get(key, ()), key=lambda m: (m[0], m[2]))  # step, timestamp
        metrics[key] = [[step, value, ts] for step, value, ts in hist]
    tags = {k: v for k, v in sorted(run.data.tags.items())}
    tags.setdefault(EXPORTED_ID_TAG, run_id)  # a re-export keeps the first store's id
    return {"run_id": tags[EXPORTED_ID_TAG], "status": run.info.status,
            "start_time": run.info.start_time, "end_time": run.info.end_time,
            "tags": tags, "params": dict(sorted(run.data.params.items())), "metrics": metrics}


def export_runs(client: MlflowClient, run_ids: Iterable[str], path: Path) -> Path:
    """Write the runs as gzipped JSON lines (sorted by original run id, no gzip timestamp)."""
    records = sorted((_record(client, rid) for rid in set(run_ids)), key=lambda r: r["run_id"])
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
        for rec in records:
            gz.write((json.dumps(rec, sort_keys=True, allow_nan=True) + "\n").encode())
    path.write_bytes(buf.getvalue())
    return path


def read_export(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def import_runs(path: Path, tracking_uri: str, experiment: str, *,
                skip_present: bool = False) -> tuple[int, int]:
    """Load an export into ``experiment`` at ``tracking_uri`` (created if missing); returns the
    numbers of runs loaded and left out. ``skip_present``: a run whose original id is already
    in the experiment (``rlbench.exported_run_id``, or its own id) is left out, so loading the
    same export twice loads it once."""
    client = open_client(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp else client.create_experiment(experiment)
    records = read_export(path)
    present = set()
    if skip_present and exp is not None:
        present = {r.data.tags.get(EXPORTED_ID_TAG, r.info.run_id)
                   for r in client.search_runs([exp_id], max_results=50000)}
    loaded, bulk = 0, is_database(tracking_uri)
    for rec in records:
        if rec["run_id"] in present:
            continue
        run = client.create_run(exp_id, start_time=rec["start_time"],
                                tags={**rec["tags"], EXPORTED_ID_TAG: rec["run_id"]})
        rid = run.info.run_id
        params = [Param(k, v) for k, v in rec["params"].items()]
        for i in range(0, len(params), 100):
            client.log_batch(rid, params=params[i:i + 100])
        if bulk:  # the same rows as log_batch writes, in one statement (metric_rows.py)
            write_histories(tracking_uri, [(rid, rec["metrics"])])
        else:
            metrics = [Metric(k, float(v), ts, step)
                       for k, points in rec["metrics"].items() for step, v, ts in points]
            for i in range(0, len(metrics), _BATCH):
                client.log_batch(rid, metrics=metrics[i:i + _BATCH])
        client.set_terminated(rid, rec["status"], end_time=rec["end_time"])
        present.add(rec["run_id"])
        loaded += 1
    return loaded, len(records) - loaded
