"""``rlbench claims``: the claims ledger, docs/claims.md, regenerated from the pre-registered
claims (docs/claims/*.yaml) and the committed boards they name (harness/report/claims_ledger.py
holds the verdict rules). Run from the repository root:

    rlbench claims [--out docs/claims.md]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.report.claims_ledger import OUT, write_ledger


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=OUT, help=f"the page to write (default {OUT})")
    p.add_argument("--claims", default="docs/claims",
                   help="the folder of claim files (default docs/claims)")


def cmd_claims(args: argparse.Namespace) -> None:
    changed = write_ledger(Path.cwd(), args.out, args.claims)
    print(f"wrote {args.out} ({'changed' if changed else 'unchanged'})")
