"""Runs per second of AZR checks: the full local sandbox vs a bare subprocess (the peer).

Compares: the AZR domain's sandboxed execute (bubblewrap, own uid, tmpfs workdir, limits) against the
same AZR driver run by a bare ``python -S -B`` subprocess, on the same functions and inputs.

The functions are the AZR domain's seed programs (the small pure functions its generator imitates),
each called on its own inputs, with the domain's default sandbox settings. Both arms start every run
in a new session (bubblewrap's ``--new-session`` does so for the sandbox; the bare arm asks Popen to),
so the kernel's autogroup scheduler treats them alike. The arms are interleaved (timing.compare).

    python benchmarks/sandbox.py [--runs 20] [--repeats 5]
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from timing import compare, ratio, report

from propel_azr.plugin import DRIVER
from propel_core.plugins import Registry

# the interpreter and flags the sandbox uses too (standard library only), so only isolation differs
BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="programs run per timed call of each arm")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    domain = Registry.build().domain("azr")
    seeds = [context.data for context in domain.contexts()]
    programs = [(seeds[i % len(seeds)]["code"], seeds[i % len(seeds)]["inputs"]) for i in range(args.runs)]

    with tempfile.TemporaryDirectory() as tmp:
        folders = []
        for i, (code, inputs) in enumerate(programs):  # written once: the bare arm times the run alone
            folder = Path(tmp) / f"p{i}"
            folder.mkdir()
            (folder / "main.py").write_text(DRIVER)
            (folder / "candidate.py").write_text(code)
            folders.append((folder, json.dumps(inputs)))

        def bare() -> None:
            for folder, inputs in folders:
                (folder / "inputs.json").write_text(inputs)  # the driver removes it before f runs
                subprocess.run(
                    [BASE_PYTHON, "-S", "-B", "main.py"],
                    cwd=folder,
                    check=True,
                    capture_output=True,
                    start_new_session=True,
                    stdin=subprocess.DEVNULL,
                )
                json.loads((folder / "result.json").read_text())

        def sandboxed() -> None:
            for code, inputs in programs:
                result = domain.execute(code, inputs)
                assert result.ok, result.detail

        peer = "bare subprocess, new session (peer)"
        times = compare({peer: bare, "local sandbox (azr execute)": sandboxed}, repeats=args.repeats, warmup=1)
    print(f"{args.runs} AZR seed programs per call, each on its inputs; isolated: {domain.sandbox.isolated}")
    report("local sandbox vs a bare subprocess, per call of each arm", times, baseline=peer, per=(args.runs, "runs"))
    low, mid = ratio(times, peer, "local sandbox (azr execute)")
    print(f"sandbox run rate / bare run rate: {low:.2f}x (min), {mid:.2f}x (median)")


if __name__ == "__main__":
    main()
