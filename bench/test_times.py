"""Where the test suite's time goes, per file, from pytest's JUnit XML (``make test`` writes
``test-report.xml``): the files that hold a pytest-xdist worker longest, which ``--dist loadfile``
cannot split, and the suite's total.

    python bench/test_times.py [test-report.xml] [--top 25]

A file's time is the sum of its tests' (setup, call and teardown as JUnit counts them), so a
module fixture that starts a server is charged to the file's first test.
"""

from __future__ import annotations

import argparse
import collections
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def file_of(classname: str) -> str:
    """``tests.api.test_x.TestY`` → ``tests/api/test_x.py``."""
    parts = classname.split(".")
    for i in range(len(parts), 0, -1):
        if parts[i - 1].startswith("test_"):
            return "/".join(parts[:i]) + ".py"
    return classname


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", nargs="?", default="test-report.xml")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    path = Path(args.report)
    if not path.exists():
        sys.exit(f"{path}: no report (make test writes it)")
    per_file: dict[str, float] = collections.defaultdict(float)
    count: dict[str, int] = collections.Counter()
    for case in ET.parse(path).getroot().iter("testcase"):
        name = file_of(case.get("classname", ""))
        per_file[name] += float(case.get("time", 0) or 0)
        count[name] += 1
    total = sum(per_file.values())
    print(f"test time by file ({len(per_file)} files, {sum(count.values())} tests, "
          f"{total:.0f} s summed over the workers):")  # fmt: skip
    for name, seconds in sorted(per_file.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"{seconds:8.1f} s  {100 * seconds / total:4.1f}%  {count[name]:4d}  {name}")


if __name__ == "__main__":
    main()
