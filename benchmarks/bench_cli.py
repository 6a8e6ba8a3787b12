"""`make bench-cli`: median wall time of `specconvert --help` beside `python -c pass`.

Both are measured side by side in one run (interleaved) so machine noise hits both.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

RUNS = 15


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    bare = [sys.executable, "-c", "pass"]
    cli = [sys.executable, "-m", "specconvert", "--help"]
    validate = [sys.executable, "-m", "specconvert", "recipe", "validate", "recipes/smollm2-135m-eagle3-cpu.yaml"]
    results = {"python -c pass": [], "specconvert --help": [], "specconvert recipe validate": []}
    for cmd in (bare, cli, validate):  # warm the page cache
        timed(cmd)
    for _ in range(RUNS):
        results["python -c pass"].append(timed(bare))
        results["specconvert --help"].append(timed(cli))
        results["specconvert recipe validate"].append(timed(validate))
    base = statistics.median(results["python -c pass"])
    print(f"{'command':32} {'median ms':>10} {'vs python':>10}")
    for name, values in results.items():
        med = statistics.median(values)
        print(f"{name:32} {med * 1000:10.1f} {med / base:9.2f}x")


if __name__ == "__main__":
    main()
