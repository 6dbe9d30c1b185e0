"""Runs per second of AZR checks: the full local sandbox vs a bare subprocess (the peer).

Compares: the AZR domain's sandboxed execute (bubblewrap, own uid, tmpfs workdir, limits, address
randomization off) against the same AZR driver run by a bare ``python -S -B`` subprocess, on the same
functions and inputs; and against the same sandbox with address randomization left on (what the
``setarch -R`` layer costs).

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

        def sandboxed(azr) -> None:
            for code, inputs in programs:
                result = azr.execute(code, inputs)
                assert result.ok, result.detail

        # the layer before it was added: the same sandbox without ``setarch -R`` in front of python
        randomized = Registry.build().domain("azr")
        with_setarch = randomized.sandbox._limits
        randomized.sandbox._limits = lambda time_limit=None: with_setarch(time_limit)[:-3]
        peer = "bare subprocess, new session (peer)"
        arms = {
            peer: bare,
            "local sandbox (azr execute)": lambda: sandboxed(domain),
            "local sandbox, address randomization on": lambda: sandboxed(randomized),
        }
        times = compare(arms, repeats=args.repeats, warmup=1)
    print(f"{args.runs} AZR seed programs per call, each on its inputs; isolated: {domain.sandbox.isolated}")
    report("local sandbox vs a bare subprocess, per call of each arm", times, baseline=peer, per=(args.runs, "runs"))
    low, mid = ratio(times, peer, "local sandbox (azr execute)")
    print(f"sandbox run rate / bare run rate: {low:.2f}x (min), {mid:.2f}x (median)")
    low, mid = ratio(times, "local sandbox, address randomization on", "local sandbox (azr execute)")
    print(f"with setarch -R / without: {low:.2f}x (min), {mid:.2f}x (median) of the run rate")


if __name__ == "__main__":
    main()
