"""What a checked method's widened subsets were, read from demo reports (no run): per method, how many parts widened,
the mean fraction a stage ended at, the mean all-equal share of the parts trained above the base fraction, and, where
the method leaves prompts out of a widened subset (``check.widened: no_harm``), what share of the pool it left out.
Round 17 (docs/demo.md) reads it to say why leaving out the prompts of negative gain widened sooner.

    python benchmarks/widened_parts.py --report lists=R/report.json [--report ...] --methods checked,checked_noharm \\
        --out DIR  -> DIR/widened_parts.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit, report_items  # noqa: E402


def read(reports: list[tuple[str, dict]], methods: tuple[str, ...]) -> dict[str, dict]:
    """method -> its widenings, stages, mean end fraction, the above-base parts' mean all-equal share, and the left-out
    share of the pool (min, median, max over the parts that record one; None where none does)."""
    out = {}
    for method in methods:
        widened, ends, shares, left = 0, [], [], []
        for _, report in reports:
            base, pool = report["settings"]["select_fraction"], report["settings"]["pool_size"]
            for stages in report["checks"][method].values():
                for record in stages.values():
                    if not isinstance(record, dict) or "parts" not in record:
                        continue  # a stage that ran unchecked
                    for part in record["parts"]:
                        widened += bool(part.get("widened"))
                        if part["fraction"] > base and part.get("zero_share") is not None:
                            shares.append(part["zero_share"])
                        if part.get("negative") is not None:
                            left.append(part["negative"] / pool)
                    ends.append(record["end"]["fraction"])
        out[method] = {"widenings": widened, "stages": len(ends), "mean_end_fraction": round(statistics.fmean(ends), 4),
                       "wider_parts": len(shares),
                       "wider_parts_zero_share": round(statistics.fmean(shares), 4) if shares else None,
                       "left_out_share": ({"min": round(min(left), 4), "median": round(statistics.median(left), 4),
                                           "max": round(max(left), 4), "parts": len(left)} if left else None)}
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report", action="append", required=True, help="TASK=path/to/report.json")
    ap.add_argument("--methods", default="checked", help="comma-separated checked methods every report holds")
    ap.add_argument("--out", type=Path, help="folder for widened_parts.json")
    args = ap.parse_args(argv)
    reports = report_items(args.report)
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    result = {"definition": __doc__.split("\n\n")[0].replace("\n", " "), "tasks": [t for t, _ in reports],
              "methods": read(reports, methods)}
    return emit(args.out, "widened_parts.json", result, "methods")


if __name__ == "__main__":
    main()
