"""Wall time of `propel --help` and `propel plugins` (target: well under a second each).

python benchmarks/cli_startup.py
"""

import shutil
import subprocess
import time


def best_of(args: list[str], runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(args, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    propel = shutil.which("propel") or "propel"
    for args in (["--help"], ["plugins"], ["plugins", "--json"]):
        print(f"propel {' '.join(args):15s} {best_of([propel, *args]):.3f} s (best of 5)")


if __name__ == "__main__":
    main()
