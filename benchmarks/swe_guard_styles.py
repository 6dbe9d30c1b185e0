"""Which real test styles the SWE guard breaks: each repository's suite run twice outside the
sandbox with pytest, once as shipped and once as if a change had written every line of its code (the
worst case: the guard judges only the lines a change wrote), counting the tests whose outcome
differs and what the guard refused. Default: six 1.17.0, more-itertools 10.5.0, toolz 1.0.0 and
cachetools 5.5.0 from their PyPI sdists, and the test-styles repository in the SWE tests' data.

    python benchmarks/swe_guard_styles.py [--repo six==1.17.0 ...]
"""

import argparse
import json
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from propel_core.embedded import cache_dir
from propel_swe import guard
from propel_swe.checkout import python_environment, sdist_checkout

REPOS = ["six==1.17.0", "more-itertools==10.5.0", "toolz==1.0.0", "cachetools==5.5.0"]
STYLES = Path(__file__).parent.parent / "domains" / "propel-swe" / "tests" / "data" / "teststyles"
DRIVER = """
import json, sys
root, guard_dir, everything = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
sys.path[:0] = [guard_dir, root] + ([root + "/src"] if __import__("os").path.isdir(root + "/src") else [])
refusals = lambda: ()
if everything:
    import guard
    written = json.load(open(guard_dir + "/written.json"))
    refusals, _ = guard.install(root, written)
import pytest

class Recorder:
    outcomes = {}
    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            self.outcomes[report.nodeid] = report.outcome

pytest.main([root, "-q", "-p", "no:cacheprovider"], plugins=[Recorder()])
print("RESULT " + json.dumps({"outcomes": Recorder.outcomes, "refused": list(refusals())}))
"""


def run(python: Path, root: Path, folder: Path, everything: bool) -> dict:
    done = subprocess.run(
        [str(python), str(folder / "driver.py"), str(root), str(folder), "1" if everything else "0"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    line = next((line for line in done.stdout.splitlines() if line.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"no result from {root}: {done.stderr[-1000:]}")
    return json.loads(line[len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", action="append", help="a PyPI requirement name==version (repeatable)")
    args = parser.parse_args()
    env = python_environment(cache_dir() / "swe" / "test-env", ["pytest"])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        shutil.copy(guard.__file__, folder / "guard.py")
        (folder / "driver.py").write_text(DRIVER)
        sources = [
            (name, sdist_checkout(name, cache_dir() / "swe" / "sdists", folder / name)) for name in args.repo or REPOS
        ]
        sources.append(("teststyles", Path(shutil.copytree(STYLES, folder / "teststyles"))))
        for name, root in sources:
            written = {
                str(path.relative_to(root)): list(range(1, len(path.read_text(errors="replace").splitlines()) + 1))
                for path in root.rglob("*.py")
                if not guard.is_test_path(str(path.relative_to(root)))
            }
            (folder / "written.json").write_text(json.dumps(written))
            shipped, guarded = (
                run(env / "bin" / "python", root, folder, False),
                run(env / "bin" / "python", root, folder, True),
            )
            before, after = shipped["outcomes"], guarded["outcomes"]
            broken = sorted(
                test for test, outcome in before.items() if outcome == "passed" and after.get(test) != "passed"
            )
            refused = Counter(guarded["refused"])
            rows.append({"repo": name, "tests": len(before), "broken": broken, "refused": dict(refused)})
            print(
                f"{name}: {len(before)} tests, {len(broken)} pass as shipped and not when the change wrote every line"
            )
            for test in broken[:10]:
                print(f"  {test}")
            for what, count in refused.most_common():
                print(f"  refused {count}x: {what}")
    print(json.dumps([{**row, "broken": len(row["broken"])} for row in rows]))


if __name__ == "__main__":
    main()
