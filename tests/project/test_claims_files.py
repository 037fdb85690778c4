"""docs/claims/ (issue 36, item 1): one pre-registered claim per seed paper, written before its
testbed's runs, in a fixed schema that docs/claims.md will be generated from; every method and
testbed it names exists (or is declared to be built)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CLAIMS = sorted((ROOT / "docs" / "claims").glob("*.yaml"))
KEYS = ["paper", "methods", "claim", "claim_number", "claim_unit", "testbed", "primary",
        "powered_for", "controls", "cannot_show", "gpu_only"]
PAPERS = {"lpo", "agpo", "aem", "lope", "arpo", "aepo", "arbitrary_entropy", "lantern"}


def test_every_seed_paper_has_a_preregistered_claim():
    assert {p.stem for p in CLAIMS} == PAPERS


@pytest.mark.parametrize("path", CLAIMS, ids=[p.stem for p in CLAIMS])
def test_a_claim_has_the_schema_and_names_what_exists(path):
    entry = yaml.safe_load(path.read_text())
    assert [k for k in entry if k != "amended"] == KEYS, path.name
    lantern = path.stem == "lantern"
    methods_dir = ROOT / "conf" / ("lantern/agent" if lantern else "algorithm")
    assert entry["methods"] and all((methods_dir / f"{m}.yaml").is_file()
                                    for m in entry["methods"]), entry["methods"]
    bed = entry["testbed"]
    assert bed["status"] in ("existing", "to_build") and bed["why"]
    if bed["status"] == "existing":
        sweeps = ROOT / "conf" / ("lantern/sweep" if lantern else "sweep")
        assert (sweeps / f"{bed['sweep']}.yaml").is_file(), bed["sweep"]
    else:
        assert bed["sweep"] is None or not (ROOT / "conf" / "sweep" / f"{bed['sweep']}.yaml"
                                            ).is_file()
    assert set(entry["primary"]) == {"metric", "comparison", "test"}
    assert all(entry["primary"].values())
    power = entry["powered_for"]
    assert set(power) == {"effect", "seeds", "source"} and power["source"]
    assert (power["effect"] is None) == (power["seeds"] is None)
    assert set(entry["controls"]) == {"positive", "aa"} and all(entry["controls"].values())
    assert entry["cannot_show"] and isinstance(entry["gpu_only"], bool)
