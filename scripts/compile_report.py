"""Where a cold test suite spends its compile time, from a ``LLAMACPY_COMPILE_LOG`` file.

Run the suite on a clean clone with ``LLAMACPY_COMPILE_LOG=/tmp/compile.log`` (the test
conftest then logs every kernel compiled, with the test that triggered it), then::

    python scripts/compile_report.py /tmp/compile.log [--top 30]

It prints the compile seconds by test file, by test, and by kernel (each kernel's own time:
its compile minus the compiles nested in it), and how many format sets / contexts each
kernel was compiled for. Several logs (one per pytest worker) may be given.
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict


def read(paths: list[str]) -> list[tuple[str, int, str, str, float, float]]:
    """``(test, depth, kernel, kind, seconds, own seconds)`` per compile, in end order."""
    rows = []
    for path in paths:
        entries = []
        with open(path) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) != 5:
                    continue
                test, depth, kernel, kind, secs = parts
                entries.append([test, int(depth), kernel, kind, float(secs), float(secs)])
        # a compile's nested compiles end before it, one level deeper
        pending: dict[int, float] = defaultdict(float)
        for e in entries:
            d = e[1]
            e[5] = max(0.0, e[4] - pending.pop(d + 1, 0.0))
            for deeper in [k for k in pending if k > d]:
                pending.pop(deeper)
            pending[d] += e[4]
        rows += [tuple(e) for e in entries]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    rows = read(a.logs)
    total = sum(r[5] for r in rows)
    print(f"{len(rows)} compiles, {total:.0f} s of compile time\n")
    by_file, by_test, by_kernel = Counter(), Counter(), Counter()
    kinds = defaultdict(set)
    for test, _, kernel, kind, _, own in rows:
        by_file[test.split("::")[0]] += own
        by_test[test] += own
        by_kernel[kernel] += own
        kinds[kernel].add(kind)
    for title, counter in (("test file", by_file), ("test", by_test), ("kernel", by_kernel)):
        print(f"--- by {title}")
        for key, s in counter.most_common(a.top):
            extra = f"  ({len(kinds[key])} variants)" if title == "kernel" else ""
            print(f"{s:8.1f}  {key}{extra}")
        print()


if __name__ == "__main__":
    main()
