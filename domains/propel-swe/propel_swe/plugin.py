"""Registers the ``swe`` domain, its ``swe_bug`` predicate, the ``docker`` sandbox and ``propel swe``."""

from __future__ import annotations

import json

import click

from propel_core import hookimpl


@hookimpl
def register_domains(register):
    from propel_swe.domain import SWE

    register("swe", SWE)


@hookimpl
def register_validity_predicates(register):
    from propel_swe.domain import check_bug

    register("swe_bug", check_bug)


@hookimpl
def register_sandboxes(register):
    from propel_swe.docker_sandbox import DockerSandbox

    register("docker", DockerSandbox)


@hookimpl
def register_commands(cli):
    @cli.group()
    def swe():
        """Repository tools of the SWE bug-injection domain."""

    @swe.command(context_settings={"ignore_unknown_options": True})
    @click.argument("config", type=click.Path(exists=True, dir_okay=False))
    @click.argument("overrides", nargs=-1)
    @click.option("--force", is_flag=True, help="Run again even where a cached preflight exists.")
    @click.pass_context
    def preflight(ctx: click.Context, config: str, overrides: tuple[str, ...], force: bool) -> None:
        """Run every repository's suite once on its clean checkout; keep those with status ok, a test
        that passed and at most one baseline failure, naming the failing tests -> RUN/swe/preflight.json.
        Reads CONFIG with key=value OVERRIDES."""
        from propel_core import PropelError, start
        from propel_swe.verifier import named

        run = start(ctx, [config], overrides)
        domain = run.domain()
        if run.config.domain.name != "swe":
            raise PropelError(f"propel swe preflight needs domain.name: swe, not {run.config.domain.name!r}")
        rows = []
        with run.progress("preflight", total=len(domain.repos)) as advance:
            for repo in domain.repos.values():
                baseline = domain.baseline(repo, force=force)
                rows.append(
                    {
                        "repo": repo.name,
                        "status": baseline.status,
                        "tests": baseline.test_count,
                        "failures": baseline.failures,
                        "failing_tests": baseline.failing,
                        "seconds": round(baseline.duration, 2),
                        "kept": baseline.keep,
                        "reasons": baseline.reasons,
                        "tests_outcomes": baseline.tests,
                    }
                )
                advance(1)
        out = run.dir / "swe" / "preflight.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rows, indent=2))
        click.echo(f"{'repository':30} {'status':10} {'tests':>6} {'fail':>5} {'seconds':>8}  kept")
        for row in rows:
            kept = "yes" if row["kept"] else "no: " + "; ".join(row["reasons"])
            click.echo(
                f"{row['repo'][:30]:30} {row['status']:10} {row['tests']:6d} {row['failures']:5d} "
                f"{row['seconds']:8.2f}  {kept}"
            )
            if row["failing_tests"] and row["kept"]:  # a dropped one's reasons name them already
                click.echo(f"{'':30} failing: {named(row['failing_tests'])}")
        click.echo(f"kept {sum(r['kept'] for r in rows)} of {len(rows)}; details in {out}")

    @swe.command(context_settings={"ignore_unknown_options": True})
    @click.argument("config", type=click.Path(exists=True, dir_okay=False))
    @click.argument("overrides", nargs=-1)
    @click.option(
        "--bugs", type=click.IntRange(1), default=10, show_default=True, help="Procedural bugs per repository."
    )
    @click.pass_context
    def verdicts(ctx: click.Context, config: str, overrides: tuple[str, ...], bugs: int) -> None:
        """Try the verifier on each repository before training on it: verify its first BUGS procedural
        bugs; each valid bug's revert must solve it, a change that does nothing and a README edit must
        not, and the revert written in ordinary shapes of fix must solve the first -> RUN/swe/verdicts.json."""
        from propel_core import PropelError, start
        from propel_swe.verdicts import FIX_SHAPES, survey

        run = start(ctx, [config], overrides)
        if run.config.domain.name != "swe":
            raise PropelError(f"propel swe verdicts needs domain.name: swe, not {run.config.domain.name!r}")
        domain = run.domain()
        found = []
        with run.progress("verdicts", total=bugs * len(domain.repos)) as advance:
            for name in domain.repos:
                found.append(survey(domain, name, bugs, progress=advance))
        out = run.dir / "swe" / "verdicts.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(found, indent=1))
        click.echo(
            f"{'repository':30} {'valid':>7} {'replayed':>8} {'unjudged':>8} {'reverts':>8} {'no-ops':>7} "
            f"{'readme':>7} {'shapes':>7}"
        )
        for row in found:
            shapes = f"{sum(row['shapes_solved'].values())}/{len(FIX_SHAPES) if row['shapes_solved'] else 0}"
            valid, reverts = f"{row['valid']}/{row['bugs']}", f"{row['reverts_solved']}/{row['valid']}"
            click.echo(
                f"{row['repo'][:30]:30} {valid:>7} {row['replayed']:8d} {row['unjudged']:8d} {reverts:>8} "
                f"{row['no_ops_solved']:7d} {row['readme_edits_solved']:7d} {shapes:>7}"
            )
        click.echo(
            "reverts and shapes should all solve, no-ops and README edits none (unjudged: valid bugs whose code "
            "changed no answer the replay sees, kept on the other layers' judgment); each bug's verdicts and "
            f"reasons are in {out}"
        )

    @swe.command()
    @click.argument("tag")
    @click.option(
        "--python-env",
        required=True,
        type=click.Path(exists=True, file_okay=False),
        help="A virtual environment with the repositories' test dependencies.",
    )
    def image(tag: str, python_env: str) -> None:
        """Build a base image for the docker sandbox from this machine's own files (bash, git, the
        interpreter, PYTHON_ENV) and docker import it as TAG: for engines that cannot pull."""
        from pathlib import Path

        from propel_swe.docker_sandbox import DockerSandbox
        from propel_swe.image import import_image

        image_id = import_image(DockerSandbox(disk_gb=None).client, tag, Path(python_env).absolute())
        click.echo(f"imported {tag} ({image_id[:19]}); use it as the docker sandbox's base_image")
