"""Runs per second of a trivial AZR check: the full local sandbox vs a bare subprocess.

Both run the same AZR driver on the same function and inputs, one after another in one process.

    python benchmarks/sandbox.py [runs]
"""

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from propel_azr.plugin import DRIVER
from propel_core.plugins import Registry

CODE = "def f(xs):\n    return sorted(xs)[::-1]\n"
INPUTS = [[[i, i * 7 % 5, 3]] for i in range(10)]
# the interpreter and flags the sandbox uses too (standard library only), so only isolation differs
BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)


def bare(runs: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "main.py").write_text(DRIVER)
        (work / "candidate.py").write_text(CODE)
        (work / "inputs.json").write_text(json.dumps(INPUTS))
        start = time.perf_counter()
        for _ in range(runs):
            subprocess.run([BASE_PYTHON, "-S", "-B", "main.py"], cwd=work, check=True, capture_output=True)
            json.loads((work / "result.json").read_text())
        return runs / (time.perf_counter() - start)


def sandboxed(runs: int) -> float:
    domain = Registry.build().domain("azr")
    start = time.perf_counter()
    for _ in range(runs):
        assert domain.execute(CODE, INPUTS).ok
    return runs / (time.perf_counter() - start)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    bare_rate, sandbox_rate = bare(runs), sandboxed(runs)
    print(f"bare subprocess:  {bare_rate:6.1f} runs/s")
    print(f"local sandbox:    {sandbox_rate:6.1f} runs/s")
    print(f"sandbox / bare:   {sandbox_rate / bare_rate:6.2f}x")


if __name__ == "__main__":
    main()
