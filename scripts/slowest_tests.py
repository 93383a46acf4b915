"""The slowest tests of a whole run, from pytest's JUnit XML reports (one per pytest pass).

scripts/test.sh runs the suite in two passes (the tests that time nothing two at a time, then the
rest alone) and prints this at the end: each pass's totals, the N slowest tests over both, and
the M test files (a notebook is one) that took longest in all.

    python scripts/slowest_tests.py REPORT.xml [REPORT.xml ...] [--top 25] [--files 10]
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


OUTCOMES = {"failure": "failed", "error": "error", "skipped": "skipped"}     # JUnit's tag: pytest's word


def read_cases(path: Path) -> list[tuple[float, str, str]]:
    """``(seconds, test id, outcome)`` of every test case in one report."""
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome = next((word for tag, word in OUTCOMES.items() if case.find(tag) is not None), "passed")
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        cases.append((float(case.get("time", 0.0)), name, outcome))
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path, help="JUnit XML files written by pytest --junitxml")
    parser.add_argument("--top", type=int, default=25, help="how many of the slowest tests to list (default 25)")
    parser.add_argument("--files", type=int, default=0, help="also list the N test files that took longest (default 0)")
    args = parser.parse_args(argv)
    if args.top < 1:
        parser.error(f"--top {args.top}: must be at least 1")
    if args.files < 0:
        parser.error(f"--files {args.files}: must be at least 0")
    everything = []
    for path in args.reports:
        if not path.is_file():
            print(f"slowest_tests: no report at {path} (did that pytest pass run?)", file=sys.stderr)
            return 2
        cases = read_cases(path)
        counts = {o: sum(c[2] == o for c in cases) for o in ("passed", *OUTCOMES.values())}
        print(f"{path.name}: {len(cases)} tests, {sum(c[0] for c in cases):.0f} s of test time, "
              + ", ".join(f"{n} {o}" for o, n in counts.items() if n))
        everything += cases
    print(f"the {min(args.top, len(everything))} slowest tests of this run:")
    for seconds, name, outcome in sorted(everything, reverse=True)[:args.top]:
        print(f"{seconds:8.1f} s  {name}" + ("" if outcome == "passed" else f"  ({outcome})"))
    if args.files:
        by_file: dict[str, list[float]] = {}
        for seconds, name, _ in everything:
            by_file.setdefault(name.split("::")[0], []).append(seconds)
        print(f"the {min(args.files, len(by_file))} test files that took longest:")
        for module, times in sorted(by_file.items(), key=lambda kv: -sum(kv[1]))[:args.files]:
            print(f"{sum(times):8.1f} s  {module}  ({len(times)} tests)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
