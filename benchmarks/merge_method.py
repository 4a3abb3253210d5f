"""A committed demo report with one method's entries replaced by another run's, for a round's decision.

A round reruns only the checked method (and ``full``, which the demo always runs). Every per-method entry
of a report (AUC, accelerations, curves, checks, costs) depends only on that method's runs and ``full``'s,
so the committed report with ``--as``'s entries replaced by ``--method``'s from the new report is the report
the round's method would have had in the committed folder, provided ``full`` reran bit for bit (checked
here: the merge refuses otherwise, unless ``--across-machines`` says the new report ran where the committed
runs cannot repeat bit for bit; the method's entries then stand against its own run's ``full``, and both fulls'
AUC are recorded). An entry the new report lacks for the method is dropped, not kept stale.

    python benchmarks/merge_method.py --committed benchmarks/results/demo/report.json --new R/report.json \\
        --method checked_refresh --as checked --out OUT/report.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def merge(committed, new, method: str, into: str):
    """``committed`` with every ``into`` entry of a per-method dict replaced by ``new``'s ``method`` entry."""
    if not isinstance(committed, dict):
        return committed
    out = {}
    for key, value in committed.items():
        if key == into:
            if isinstance(new, dict) and method in new:
                out[key] = new[method]
            continue  # the new report lacks it: dropped, not kept stale
        out[key] = merge(value, new.get(key) if isinstance(new, dict) else None, method, into)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--committed", required=True, type=Path)
    ap.add_argument("--new", required=True, type=Path)
    ap.add_argument("--method", required=True)
    ap.add_argument("--as", dest="into", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--across-machines", action="store_true",
                    help="the new report ran on another machine, where full cannot rerun bit for bit: merge anyway, "
                         "the method's entries measured against its own run's full, both fulls' AUC recorded")
    a = ap.parse_args(argv)
    committed, new = json.loads(a.committed.read_text()), json.loads(a.new.read_text())
    same_full = committed["accuracy_by_step"]["full"] == new["accuracy_by_step"]["full"]
    if not same_full and not a.across_machines:
        raise SystemExit(f"full did not rerun bit for bit in {a.new}: the reports are not comparable "
                         "(--across-machines if the new report ran on another machine)")
    merged = merge(committed, new, a.method, a.into)
    merged["merged"] = {"committed": str(a.committed), "new": str(a.new.name), "method": a.method, "as": a.into}
    if not same_full:
        merged["merged"]["full_auc"] = {"committed": committed["auc_by_method"]["full"],
                                        "new": new["auc_by_method"]["full"]}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(merged, indent=1) + "\n")
    return merged


if __name__ == "__main__":
    main()
