"""docs/claims/ (issue 36, item 1): one pre-registered claim per seed paper, written before its
testbed's runs, in a fixed schema that docs/claims.md is generated from; every method, testbed,
board page and board row it names exists (or, for a testbed, is declared to be built)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from harness.report.claims_ledger import LedgerError, load_claims

ROOT = Path(__file__).resolve().parents[2]
CLAIMS = sorted((ROOT / "docs" / "claims").glob("*.yaml"))
KEYS = ["paper", "methods", "claim", "claim_number", "claim_unit", "testbed", "primary",
        "powered_for", "controls", "cannot_show", "gpu_only", "evidence"]
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


@pytest.mark.parametrize("path", CLAIMS, ids=[p.stem for p in CLAIMS])
def test_a_claims_evidence_names_existing_board_pages_and_rows(path):
    entry = yaml.safe_load(path.read_text())
    assert isinstance(entry["evidence"], list)
    for ev in entry["evidence"]:
        page = ROOT / ev["board"]
        assert ev["board"].startswith("leaderboards/") and (page / "leaderboard.csv").is_file()
        if "curve" in ev:  # a response curve the page draws, of the claim's primary metric
            assert set(ev) == {"board", "curve", "metric", "claimed"}, ev
            assert ev["metric"] == entry["primary"]["metric"]
            assert f"### {ev['curve']}: `final/{ev['metric']}` against" in (
                page / "leaderboard.md").read_text()
            continue
        assert set(ev) <= {"board", "rows", "metric", "baseline", "controls"}, ev
        with open(page / "leaderboard.csv", newline="") as f:
            reader = csv.reader(f)
            header, labels = next(reader), {r[0] for r in reader}  # row / agent: 1st column
        named = [*ev["rows"], *(ev.get("controls") or {}).values(), *[ev.get("baseline")] * (
            "baseline" in ev)]
        assert ev["rows"] and set(named) <= labels, (ev["board"], set(named) - labels)
        if header[0] == "row":  # an rlbench board: the metric is a column family of its CSV
            assert f"{ev['metric']}/vs_baseline_mean" in header, ev["metric"]
        else:  # the LANTERN track: the metric its ledger reader knows, against an agent
            assert header[0] == "agent" and ev["metric"] == entry["primary"]["metric"]


def test_the_ledger_reads_every_claim_and_board_it_names():
    claims, pages = load_claims(ROOT)
    assert {c["stem"] for c in claims} == PAPERS
    assert set(pages) == {ev["board"] for c in claims for ev in c["evidence"]}


def test_evidence_naming_a_missing_row_is_refused_with_file_and_key(tmp_path):
    src = yaml.safe_load((ROOT / "docs" / "claims" / "agpo.yaml").read_text())
    src["evidence"] = [{**src["evidence"][0], "rows": ["no_such_row"]}]
    (tmp_path / "docs" / "claims").mkdir(parents=True)
    (tmp_path / "docs" / "claims" / "agpo.yaml").write_text(yaml.safe_dump(src))
    (tmp_path / "leaderboards").symlink_to(ROOT / "leaderboards")
    with pytest.raises(LedgerError, match=r"agpo\.yaml: evidence\[0\]\.rows: no row 'no_such_row'"):
        load_claims(tmp_path)
