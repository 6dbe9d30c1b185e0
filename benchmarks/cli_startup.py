"""Wall time of `propel --help` and `propel plugins` (target: well under a second each).

python benchmarks/cli_startup.py
"""

import subprocess
import sys
import time
from pathlib import Path


def best_of(args: list[str], runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(args, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    propel = str(Path(sys.executable).with_name("propel"))  # the one installed beside this interpreter
    for args in (["--help"], ["plugins"], ["plugins", "--json"]):
        print(f"propel {' '.join(args):15s} {best_of([propel, *args]):.3f} s (best of 5)")


if __name__ == "__main__":
    main()
