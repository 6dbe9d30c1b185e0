"""The SWE verifier on repositories nobody here wrote, registered with a name and a path alone: how many
procedural bugs it verifies (yield), whether each valid bug's exact revert solves it, that a change
doing nothing and a README edit do not, and that the revert written in each ordinary shape of fix
solves (``propel_swe.verdicts.survey``). Default: five PyPI sdists that between them hold what trips a
verifier up (``REPOS``: hypothesis in the tests' environment, a unittest suite, a src layout with a
conftest.py and ``filterwarnings = error``, a module importing ctypes at its top, objects whose repr
holds an address), 12 bugs each, local sandbox; each repository's tests run in an environment of
pytest and its own test dependencies (``--deps`` after its ``--repo``).

    python benchmarks/swe_repos.py [--bugs 12] [--repo pyrsistent==0.20.0 [--deps hypothesis] ...] [--out F.json]
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import yaml

from propel_core.embedded import cache_dir
from propel_core.plugins import Registry
from propel_swe.checkout import python_environment, sdist_checkout
from propel_swe.verdicts import FIX_SHAPES, survey

#: requirement -> (its test dependencies beside pytest, what it holds that a verifier can trip on)
REPOS = {
    "iso8601==2.1.0": (["hypothesis", "pytz"], "hypothesis (iso8601/test_iso8601.py), tests inside the package"),
    "markupsafe==3.0.2": ([], "src layout, tests/conftest.py, filterwarnings = error (pyproject.toml)"),
    "idna==3.10": ([], "unittest suite (tests/test_idna.py)"),
    "more-itertools==10.5.0": (
        [],
        "objects whose repr holds an address (peekable, seekable, bucket, countable: more_itertools/more.py)",
    ),
    "colorama==0.4.6": ([], "unittest suite (colorama/tests/*_test.py), ctypes imported at top (colorama/win32.py)"),
}


class Deps(argparse.Action):
    """``--deps a,b``: test dependencies of the ``--repo`` just before it."""

    def __call__(self, parser, namespace, values, option_string=None):
        if not namespace.repo:
            parser.error("--deps names the test dependencies of a --repo given before it")
        namespace.deps[namespace.repo[-1]] = [dep for dep in values.split(",") if dep]


def test_environment(deps: list[str]) -> Path:
    """pytest and ``deps`` in a virtual environment of their own, cached by what it holds."""
    name = "-".join(["test-env", *sorted(deps)])
    return python_environment(cache_dir() / "swe" / name, ["pytest", *deps])


def surveyed(requirement: str, deps: list[str], bugs: int, folder: Path) -> dict | None:
    """``survey`` of ``requirement``'s sdist checked out under ``folder``, its tests run beside ``deps``;
    None (and why, printed) where preflight refuses the suite."""
    started = time.monotonic()
    env = test_environment(deps)
    repo = sdist_checkout(requirement, cache_dir() / "swe" / "sdists", folder)
    name = requirement.split("==")[0]
    (folder / "repos.yaml").write_text(yaml.safe_dump({"repos": [{"name": name, "path": str(repo)}]}))
    domain = Registry.build().domain(
        "swe",
        registry=str(folder / "repos.yaml"),
        preflight_dir=str(folder / "preflight"),
        generator="procedural",
        sandbox_options={"time_limit": 120, "memory_mb": 2048, "max_processes": 64, "python_env": str(env)},
    )
    baseline = domain.baseline(domain.repos[name])
    properties = REPOS.get(requirement, ([], "not one of the defaults"))[1]
    print(f"{requirement} ({properties}): preflight {baseline.status}, {baseline.test_count} tests")
    if not baseline.keep:
        print(f"  refused: {'; '.join(baseline.reasons)[:300]}")
        return None
    done = []

    def progress(count: int) -> None:
        done.append(count)
        print(f"  bug {len(done)}/{bugs} judged at {time.monotonic() - started:.0f} s", flush=True)

    found = survey(domain, name, bugs, progress=progress)
    shapes = found["shapes_solved"]
    print(
        f"  valid {found['valid']}/{found['bugs']} ({found['replayed']} with a replay), "
        f"reverts solved {found['reverts_solved']}/{found['valid']}, "
        f"no-ops solved {found['no_ops_solved']}, README edits solved {found['readme_edits_solved']}, "
        f"fix shapes solved {sum(shapes.values())}/{len(FIX_SHAPES) if shapes else 0}, {found['seconds']:.0f} s"
    )
    for row in found["rows"]:
        if not row["valid"]:
            print(f"  invalid: {row['bug']}: {row['reason'][:160]}")
        for fix, verdict in row.get("fixes", {}).items():
            if verdict["solved"] is not (fix.startswith(("revert", "shape:"))):
                print(f"  {fix} of {row['bug']}: solved {verdict['solved']}: {(verdict['reason'] or '')[:160]}")
    found.update(requirement=requirement, deps=deps, properties=properties, tests=baseline.test_count)
    found["total_seconds"] = round(time.monotonic() - started, 1)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bugs", type=int, default=12)
    parser.add_argument("--repo", action="append", help="a PyPI requirement name==version (repeatable)")
    parser.add_argument("--deps", action=Deps, help="comma-separated test dependencies of the --repo before it")
    parser.add_argument("--out", help="write every bug's verdicts here as JSON")
    parser.set_defaults(deps={})
    args = parser.parse_args()
    known = {requirement: deps for requirement, (deps, _) in REPOS.items()}
    chosen = {req: args.deps.get(req, known.get(req, [])) for req in args.repo} if args.repo else known
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for requirement, deps in chosen.items():
            found = surveyed(requirement, deps, args.bugs, Path(tmp) / requirement)
            if found is not None:
                results.append(found)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    print(json.dumps([{k: v for k, v in found.items() if k != "rows"} for found in results]))


if __name__ == "__main__":
    main()
