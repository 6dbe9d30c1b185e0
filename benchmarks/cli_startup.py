"""Wall time of `propel --help`, `propel plugins` and `propel plugins --json` (target: well under a
second each).

Compares: each command against a bare interpreter start of the same virtual environment (the peer:
``python -c pass``, the floor any Python CLI pays). Every command runs in a fresh process started in
a new session, all alike; the commands are interleaved after a warm-up round (timing.compare).

    python benchmarks/cli_startup.py [--repeats 10]
"""

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

from timing import compare, report

PEER = "python -c pass (peer: bare interpreter)"


def command(argv: list[str]):
    def run() -> None:
        subprocess.run(argv, check=True, capture_output=True, stdin=subprocess.DEVNULL, start_new_session=True)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    propel = str(Path(sys.executable).with_name("propel"))  # the one installed beside this interpreter
    arms = {PEER: command([sys.executable, "-c", "pass"])}
    for extra in (["--help"], ["plugins"], ["plugins", "--json"]):
        arms[f"propel {' '.join(extra)}"] = command([propel, *extra])
    times = compare(arms, repeats=args.repeats, warmup=1)
    report("start-up wall time of propel commands vs a bare interpreter, one fresh process each", times, baseline=PEER)
    floor = statistics.median(times[PEER])
    for name, seconds in times.items():
        if name != PEER:
            print(f"  {name}: {statistics.median(seconds) - floor:.3f} s over the bare interpreter (medians)")


if __name__ == "__main__":
    main()
