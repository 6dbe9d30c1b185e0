"""Repository specs, the registry they live in (YAML, or imported from SWE-smith), and splits.

A spec names where a clean checkout comes from (a local git checkout, or a container image holding
one at ``workdir``), the command that runs the test suite, the parser of its machine-readable
report, and a time budget for one run of the suite.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from propel_core import PropelError


class RepoSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    path: Path | None = Field(None, description="a local git checkout (the local sandbox copies it)")
    image: str | None = Field(None, description="a container image with the checkout at workdir (docker)")
    workdir: str = "/testbed"
    test_command: str = Field(
        "python -m pytest -q -p no:cacheprovider",
        description="a shell command run from workdir; leading NAME=value words (or env NAME=value) set "
        "the tests' environment, for both runners",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="variables the tests need, for both runners (beside the command's own)"
    )
    parser: Literal["pytest"] = "pytest"
    time_budget: float = Field(
        600.0, gt=0, description="seconds for the preflight run; verification runs get 10x its duration (30 s..this)"
    )

    @model_validator(mode="after")
    def _has_a_source(self) -> RepoSpec:
        if self.path is None and self.image is None:
            raise ValueError(f"repository {self.name!r} needs a path (local checkout) or an image")
        return self

    @model_validator(mode="after")
    def _names_are_variables(self) -> RepoSpec:
        bad = sorted(name for name in self.env if not VARIABLE.fullmatch(name))
        if bad:
            raise ValueError(f"repository {self.name!r}: env names must be shell variable names: {', '.join(bad)}")
        return self

    def key(self, environment: str = "") -> str:
        """Names this exact repository state and run of its suite, as the preflight cache does: the
        commit (or image), the test command and its variables, the runners, the time budget, and
        ``environment`` (what the sandbox runs the suite with: the domain's ``environment``)."""
        state = self.image or commit_of(self.path)
        blob = json.dumps([self.name, state, self.workdir, self.test_command, self.parser, RUNNERS])
        if self.env:
            blob += json.dumps(sorted(self.env.items()))
        blob += json.dumps([self.time_budget, environment])
        return f"{self.name.replace('/', '__')}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"

    def test_environment(self) -> tuple[list[str], str]:
        """(shell lines that export the tests' environment, the test command without its leading
        assignments). The command's own ``NAME=value`` words keep their shell form, so ``$VAR`` in
        them expands in the sandbox as it would on the command line; ``env`` values are literal and
        come after. Both runners start from these lines (``verifier``)."""
        found = ASSIGNMENTS.match(self.test_command)
        raw = re.findall(r"[A-Za-z_][A-Za-z0-9_]*=(?:'[^']*'|\"[^\"]*\"|[^\s'\"])*", found.group(0)) if found else []
        lines = [f"export {word}" for word in raw]
        lines += [f"export {name}={shlex.quote(value)}" for name, value in self.env.items()]
        return lines, self.test_command[found.end() :] if found else self.test_command

    def variables(self) -> list[str]:
        """The names the tests' environment sets (``test_environment``)."""
        lines, _ = self.test_environment()
        return list(dict.fromkeys(line.split(" ", 1)[1].split("=", 1)[0] for line in lines))


RUNNERS = 3  # how the suite is run; a preflight cached by earlier runners is run again
VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: a command's leading variable assignments, optionally after ``env``
ASSIGNMENTS = re.compile(r"\s*(?:env\s+)?(?:[A-Za-z_][A-Za-z0-9_]*=(?:'[^']*'|\"[^\"]*\"|[^\s'\"])*\s+)+")


def commit_of(path: Path) -> str:
    """The checked-out commit of a local repository (ours to read: it comes from the registry)."""
    done = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True)
    if done.returncode != 0:
        raise PropelError(f"{path} is not a git checkout with a commit: {done.stderr.strip()}")
    return done.stdout.strip()


class Registry(BaseModel):
    """``repos`` and the repo-disjoint ``splits`` (probe_train, rl_train, eval, ...) over their names."""

    model_config = ConfigDict(extra="forbid")

    repos: list[RepoSpec]
    splits: dict[str, list[str]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> Registry:
        names = [repo.name for repo in self.repos]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"repository names must be unique; repeated: {', '.join(twice)}")
        seen: dict[str, str] = {}
        for split, members in self.splits.items():
            unknown = sorted(set(members) - set(names))
            if unknown:
                raise ValueError(f"split {split!r} names unknown repositories: {', '.join(unknown)}")
            for name in members:
                if name in seen:
                    raise ValueError(f"splits must be repo-disjoint: {name!r} is in {seen[name]!r} and {split!r}")
                seen[name] = split
        return self

    def select(self, split: str | None) -> list[RepoSpec]:
        """The repositories of one split, or all of them when ``split`` is None."""
        if split is None:
            return list(self.repos)
        if split not in self.splits:
            raise PropelError(f"unknown split {split!r}; the registry has: {', '.join(self.splits) or 'no splits'}")
        wanted = set(self.splits[split])
        return [repo for repo in self.repos if repo.name in wanted]


def load_registry(path: str | Path) -> Registry:
    """A registry YAML: ``repos:`` (a list of specs), optional ``swesmith:`` (SWE-smith registry files
    whose entries join ``repos``) and optional ``splits:``; relative paths are read relative to the
    file (``~`` is the user's home), and every path is made absolute. A file ending in
    ``.json``/``.jsonl`` is read as SWE-smith's registry (see :func:`from_swesmith`)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise PropelError(f"repository registry {path} does not exist")
    if path.suffix in (".json", ".jsonl"):
        return from_swesmith(path)
    data = yaml.safe_load(path.read_text()) or {}
    imported = [
        repo.model_dump()
        for source in data.pop("swesmith", [])
        for repo in from_swesmith(relative_to(path, source)).repos
    ]
    data["repos"] = [*data.get("repos", []), *imported]
    for repo in data["repos"]:
        if isinstance(repo, dict) and repo.get("path"):
            repo["path"] = str(relative_to(path, repo["path"]))
    try:
        return Registry.model_validate(data)
    except ValidationError as exc:
        raise PropelError(f"{path}: not a valid repository registry:\n{exc}") from None


def relative_to(registry: Path, path: str | Path) -> Path:
    """A path the registry file names, absolute: ``~`` expanded, a relative one read from the
    registry's folder."""
    return (registry.parent / Path(path).expanduser()).resolve()


def from_swesmith(path: Path) -> Registry:
    """SWE-smith-style entries, one JSON object each (a JSON list, or JSON lines): ``repo``
    ("owner/name"), ``image_name``, ``test_cmd``, optional ``commit`` and ``workdir``. Each becomes
    a docker spec; splits are left to the YAML that imports them."""
    text = path.read_text()
    rows = json.loads(text) if path.suffix == ".json" else [json.loads(line) for line in text.splitlines() if line]
    repos = []
    for number, row in enumerate(rows, 1):
        missing = [key for key in ("repo", "image_name", "test_cmd") if key not in row]
        if missing:
            raise PropelError(
                f"{path} entry {number}: missing {', '.join(missing)} (SWE-smith needs repo, image_name, test_cmd)"
            )
        name = row["repo"] + (f"@{row['commit'][:8]}" if row.get("commit") else "")
        repos.append(
            RepoSpec(
                name=name, image=row["image_name"], test_command=row["test_cmd"], workdir=row.get("workdir", "/testbed")
            )
        )
    return Registry(repos=repos)
