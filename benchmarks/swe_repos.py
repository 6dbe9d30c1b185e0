"""The SWE verifier on repositories nobody here wrote, registered with a name and a path alone: how many
procedural bugs it verifies (yield), whether each valid bug's exact revert solves it, that a change
doing nothing and a README edit do not, and that the revert written in each ordinary shape of fix
solves (``propel_swe.verdicts.survey``). Default: more-itertools 10.5.0 and toolz 1.0.0 (flat
layouts) and cachetools 5.5.0 (a src layout), from their PyPI sdists, 30 bugs each, local sandbox.

    python benchmarks/swe_repos.py [--bugs 30] [--repo cachetools==5.5.0 ...] [--out swe_repos.json]
"""

import argparse
import json
import tempfile
from pathlib import Path

import yaml

from propel_core.embedded import cache_dir
from propel_core.plugins import Registry
from propel_swe.checkout import python_environment, sdist_checkout
from propel_swe.verdicts import FIX_SHAPES, survey

REPOS = ["more-itertools==10.5.0", "toolz==1.0.0", "cachetools==5.5.0"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bugs", type=int, default=30)
    parser.add_argument("--repo", action="append", help="a PyPI requirement name==version (repeatable)")
    parser.add_argument("--out", help="write every bug's verdicts here as JSON")
    args = parser.parse_args()
    env = python_environment(cache_dir() / "swe" / "test-env", ["pytest"])
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for requirement in args.repo or REPOS:
            folder = Path(tmp) / requirement
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
            print(f"{requirement}: preflight {baseline.status}, {baseline.test_count} tests, {baseline.duration:.2f} s")
            found = survey(domain, name, args.bugs)
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
            results.append(found)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    print(json.dumps([{k: v for k, v in found.items() if k != "rows"} for found in results]))


if __name__ == "__main__":
    main()
