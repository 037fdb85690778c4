"""Parallel cells of one sweep share an SQLite store: a locked database and two cells inserting
the same dataset row at once are retried, any other error is raised at once."""

from __future__ import annotations

import pytest

from harness.tracking import with_retries


@pytest.mark.parametrize("message", ["database is locked",
                                     "(sqlite3.IntegrityError) UNIQUE constraint failed: "
                                     "datasets.experiment_id, datasets.name, datasets.digest"])
def test_races_of_parallel_cells_are_retried(message):
    calls = []

    def log():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError(message)
        return "logged"

    assert with_retries(log) == "logged" and len(calls) == 2


def test_other_errors_are_raised_at_once():
    calls = []

    def log():
        calls.append(1)
        raise RuntimeError("no such experiment")

    with pytest.raises(RuntimeError, match="no such experiment"):
        with_retries(log)
    assert len(calls) == 1
