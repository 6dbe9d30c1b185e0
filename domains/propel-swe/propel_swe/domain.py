"""The ``swe`` domain: a generator plants a bug in a real repository; solvers try to fix it.

A context is one repository (so grouping by context is grouping by repository, as the probe
sweep's grouped k-fold needs). The generator's episode is either the bug-writing agent in a fresh
sandbox or, with ``generator: procedural``, one AST mutation; either way the task's ``generation`` is
the trajectory as JSON, whose ``diff`` is the bug. The procedural generator uses no model and deals
out each repository's distinct mutants in a seeded order: ``episode_contexts`` numbers a run's
episodes per repository, and episode ``i`` gets mutant ``i``. The validity predicate ``swe_bug``
replays the diff on a clean checkout (see ``verifier.py``). Each solver attempt is an agent episode
in a fresh sandbox with the bug applied and git history reset (so ``git diff`` does not give the bug
away); it is graded on a clean checkout again.
"""

from __future__ import annotations

import ast
import json
import os
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

from pydantic import ValidationError

from propel_core import (
    Context,
    Domain,
    Messages,
    ParseError,
    PropelError,
    Reply,
    Task,
    Validity,
    Verdict,
    cache_dir,
    job_seed,
)
from propel_swe import agent
from propel_swe.checkout import environment_identity
from propel_swe.procedural import Mutants, source_files
from propel_swe.replay import Replay
from propel_swe.repos import RepoSpec, load_registry
from propel_swe.verifier import (
    Baseline,
    apply_diffs,
    faketime_library,
    grade_fix,
    node_ids,
    preflight,
    verify_bug,
    workspace,
)

GENERATORS = ("agent", "procedural")
#: what becomes of a bug whose failing tests fail under both runners while its code changes no answer the
#: replay sees: kept on the other layers' judgment (its replay records ``changed: 0``), or refused
UNJUDGED_BUGS = ("keep", "refuse")
#: the preflight statuses that are the suite's own result, and so are cached: it ran and reported
#: (``ok``, or ``tampered`` where the clean suite wrote what our report cannot read), or it ran past a
#: limit the sandbox gave it; never ``sandbox_error`` (the harness failed), ``no_report`` (the suite
#: never started, or ended before its report: a missing interpreter or pytest, a wrong command) or a
#: run the sandbox could not finish (``crashed``, ``no_result``)
SUITE_RESULTS = ("ok", "tampered", "timeout", "oom", "output_limit", "disk_limit")
NO_MUTANT_LEFT = "no_mutant_left"  # the stop reason of a procedural episode past the last distinct mutant
RESET_HISTORY = (
    "rm -rf .git && git init -q && git add -A && "
    "git -c user.name=propel -c user.email=propel@localhost commit -qm 'repository' --no-verify"
)


class SWE(Domain):
    multi_turn = True
    validity_predicates = ("swe_bug",)
    sandbox_runs = "repositories"
    component_options: ClassVar[dict[str, tuple[str, str]]] = {"sandbox_options": ("sandboxes", "sandbox")}

    def __init__(
        self,
        registry: str,
        split: str | None = None,
        sandbox: str = "local",
        sandbox_options: dict[str, Any] | None = None,
        generator: str = "agent",
        max_turns: int = 25,
        solver_max_turns: int = 25,
        episode_budget: float = 1800.0,
        solver_budget: float = 1800.0,
        command_time_limit: float = 120.0,
        max_output_chars: int = 4000,
        max_failing_tests_shown: int = 10,
        hidden_failing_tests: float = 0.5,
        unjudged_bugs: str = "keep",
        preflight_dir: str | None = None,
    ):
        if generator not in GENERATORS:
            raise PropelError(f"unknown swe generator {generator!r}; choose one of: {', '.join(GENERATORS)}")
        self.repos = {repo.name: repo for repo in load_registry(registry).select(split)}
        if not self.repos:
            raise PropelError(f"no repositories in {registry}" + (f" split {split!r}" if split else ""))
        self.sandbox_name, self.sandbox_options = sandbox, absolute_paths(dict(sandbox_options or {}))
        self.generator = generator
        self.max_turns, self.solver_max_turns = max_turns, solver_max_turns
        self.episode_budget, self.solver_budget = episode_budget, solver_budget
        self.command_time_limit, self.max_output_chars = command_time_limit, max_output_chars
        self.max_failing_tests_shown = max_failing_tests_shown
        if not 0 <= hidden_failing_tests < 1:
            raise PropelError(f"hidden_failing_tests is a share in [0, 1), not {hidden_failing_tests!r}")
        self.hidden_failing_tests = hidden_failing_tests
        if unjudged_bugs not in UNJUDGED_BUGS:
            raise PropelError(f"unjudged_bugs is one of {', '.join(UNJUDGED_BUGS)}, not {unjudged_bugs!r}")
        self.unjudged_bugs = unjudged_bugs
        self.preflight_dir = (
            Path(preflight_dir).expanduser().resolve() if preflight_dir else cache_dir() / "swe" / "preflight"
        )
        self._baselines: dict[str, Baseline] = {}
        self._sources: dict[str, dict[str, str]] = {}
        self._mutants: dict[tuple[str, int], Mutants] = {}  # (repository, order seed) -> its mutants
        self._mutants_lock = threading.Lock()
        self._cache_lock = threading.RLock()  # one preflight and one source listing per repository

    # -- repositories -------------------------------------------------------------------------------

    def make_sandbox(self):
        faketime_library()  # the clock recheck needs it: fail closed, naming the package
        return super().make_sandbox()

    def environment(self) -> str:
        """What the sandbox runs every suite with beyond the repository, for the preflight cache's key:
        the sandbox, its Python environment (``checkout.environment_identity`` of ``python_env``, or of
        this interpreter's prefix, the local sandbox's default) and a docker ``base_image``."""
        found = [self.sandbox_name, self.sandbox_options.get("base_image")]
        if self.sandbox_name == "local" or self.sandbox_options.get("python_env"):
            found.append(environment_identity(Path(self.sandbox_options.get("python_env") or sys.prefix)))
        return json.dumps(found)

    def baseline(self, repo: RepoSpec, force: bool = False) -> Baseline:
        """The repository's preflight, run once and cached by everything that changes it
        (``RepoSpec.key`` of ``environment``; the file is replaced whole, so another process never
        reads half of one). Only the suite's own result is written (``SUITE_RESULTS``): a run the
        harness failed (``sandbox_error``) or whose suite never started or reported is run again by
        the next process that asks."""
        with self._cache_lock:
            if repo.name in self._baselines and not force:
                return self._baselines[repo.name]
            key = repo.key(self.environment())
            path = self.preflight_dir / f"{key}.json"
            if path.exists() and not force:
                found = Baseline.model_validate_json(path.read_text())
            else:
                found = preflight(self.sandbox, repo).model_copy(update={"key": key})
                if found.status in SUITE_RESULTS:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
                    partial.write_text(found.model_dump_json())
                    os.replace(partial, path)
            self._baselines[repo.name] = found
            return found

    def contexts(self) -> list[Context]:
        """One context per repository that passes preflight (status ok, a test that passed, at most one
        failure)."""
        baselines = {name: self.baseline(repo) for name, repo in self.repos.items()}
        kept = [repo for repo in self.repos.values() if baselines[repo.name].keep]
        if not kept:
            reasons = "; ".join(f"{name}: {', '.join(found.reasons)}" for name, found in baselines.items())
            raise PropelError(f"no repository passed preflight ({reasons}); see `propel swe preflight`")
        return [Context(id=repo.name, data={"repo": repo.name}, bucket=repo.name) for repo in kept]

    # -- the generator ------------------------------------------------------------------------------

    def generator_prompt(self, context: Context) -> Messages:
        repo = self.repos[context.data["repo"]]
        return [
            {"role": "system", "content": agent.BUG_WRITER_SYSTEM.format(workdir=repo.workdir)},
            {"role": "user", "content": agent.BUG_WRITER_TASK.format(repo=repo.name)},
        ]

    @property
    def uses_generator_model(self) -> bool:
        return self.generator != "procedural"

    def episode_contexts(self, contexts: list[Context], seed: int) -> list[Context]:
        """Procedural: each repository's episodes numbered in the order drawn (``mutant`` 0, 1, ...),
        with the order seed of the repository's mutants in this run (``mutant_seed``, from the run's
        seed and the repository), so episode ``i`` gets the ``i``-th distinct mutant on any worker."""
        if self.generator != "procedural":
            return contexts
        drawn: Counter[str] = Counter()
        numbered = []
        for context in contexts:
            repo = context.data["repo"]
            data = {**context.data, "mutant": drawn[repo], "mutant_seed": job_seed(seed, repo)}
            numbered.append(context.model_copy(update={"data": data}))
            drawn[repo] += 1
        return numbered

    def episode(self, context: Context, reply: Reply, seed: int) -> str:
        repo = self.repos[context.data["repo"]]
        if self.generator == "procedural":
            return json.dumps(self.procedural_episode(repo, context, seed))
        with workspace(self.sandbox, repo) as ws:
            trajectory = agent.run_episode(
                ws,
                self.generator_prompt(context),
                reply,
                agent.BUG_WRITER_TOOLS,
                self.max_turns,
                self.episode_budget,
                self.command_time_limit,
                self.max_output_chars,
            )
            trajectory["diff"] = agent.final_diff(ws) if trajectory["stop_reason"] != "error" else ""
        return json.dumps({"repo": repo.name, "generator": "agent", **trajectory})

    def procedural_episode(self, repo: RepoSpec, context: Context, seed: int) -> dict[str, Any]:
        """The context's mutant (``episode_contexts``), on a line the suite ran where preflight recorded
        them (``Baseline.lines_run``); a context no run numbered (a direct call) takes mutant number
        ``seed`` of the order seeded 0. Past the last one, no bug: the episode
        stops with ``no_mutant_left``, and ``parse`` rejects it with the reason."""
        index, order = context.data.get("mutant", seed), context.data.get("mutant_seed", 0)
        with self._mutants_lock:  # episodes in threads share the repository's mutants
            if (repo.name, order) not in self._mutants:
                lines_run = self.baseline(repo).lines_run
                self._mutants[repo.name, order] = Mutants(self.clean_sources(repo), order, lines_run)
            mutants = self._mutants[repo.name, order]
            found = mutants.get(index)
        stop_reason, (description, diff) = "stop", found or ("", "")
        if found is None:
            stop_reason = NO_MUTANT_LEFT
            description = (
                f"no mutant left: {repo.name} has {len(mutants.made)} distinct mutants and this "
                f"episode asked for number {index} (from 0)"
            )
        turn = {"assistant": f"{description}\n{diff}", "tool": None}
        return {
            "repo": repo.name,
            "generator": "procedural",
            "messages": [],
            "turns": [turn],
            "stop_reason": stop_reason,
            "detail": description,
            "seconds": 0.0,
            "diff": diff,
        }

    def clean_sources(self, repo: RepoSpec) -> dict[str, str]:
        """The clean checkout's code under test (path -> source), read once per repository: the files
        the suite imported (preflight's ``imported_files``) or, without that list, every code file but
        documentation, examples and tooling (``procedural.source_files``)."""
        with self._cache_lock:
            if repo.name not in self._sources:
                imported = self.baseline(repo).imported_files
                with workspace(self.sandbox, repo) as ws:
                    listed = ws.run("git ls-files -z").stdout.split("\0")
                    self._sources[repo.name] = {
                        path: ws.read(path).decode(errors="replace") for path in source_files(listed, imported)
                    }
            return self._sources[repo.name]

    def parse(self, generation: str) -> dict[str, Any]:
        try:
            trajectory = json.loads(generation)
        except ValueError:
            raise ParseError("not a trajectory (JSON)") from None
        if not isinstance(trajectory, dict) or not {"repo", "diff", "turns"} <= set(trajectory):
            raise ParseError("a trajectory needs repo, diff and turns")
        if trajectory["repo"] not in self.repos:
            raise ParseError(f"unknown repository {trajectory['repo']!r}")
        if trajectory.get("stop_reason") == NO_MUTANT_LEFT:
            raise ParseError(trajectory.get("detail") or "no mutant left")
        return {
            "repo": trajectory["repo"],
            "diff": trajectory["diff"],
            "stop_reason": trajectory.get("stop_reason"),
            "generator": trajectory.get("generator"),
            "turns": [turn["assistant"] for turn in trajectory["turns"]],
        }

    def render(self, payload: dict[str, Any]) -> list[str]:
        """The trajectory as the reference reads it: one text per generated assistant turn."""
        return payload["turns"] or [payload["diff"]]

    def topic(self, payload: dict[str, Any]) -> str | None:
        """The edited file (the paper's top-topic metric for SWE is the top-edited-file rate)."""
        for line in payload["diff"].splitlines():
            if line.startswith("+++ b/"):
                return f"{payload['repo']}:{line[6:]}"
        return None

    def verify(self, payload: dict[str, Any]) -> Validity:
        repo = self.repos[payload["repo"]]
        check = verify_bug(
            self.sandbox,
            repo,
            self.baseline(repo),
            payload["diff"],
            self.clean_sources(repo),
            keep_unjudged=self.unjudged_bugs == "keep",
        )
        payload["failing_tests"] = check.failing_tests
        if check.replay is not None:
            payload["replay"] = check.replay.model_dump()
        payload["verification"] = {"seconds": round(check.seconds, 3), "outcomes": check.outcomes}
        return Validity(valid=check.valid, reason=check.reason)

    # -- the solver ---------------------------------------------------------------------------------

    def hidden_tests(self, payload: dict[str, Any]) -> list[str]:
        """The bug's failing tests the solver never sees (the last ``hidden_failing_tests`` share of
        them, never the first): left out of its prompt and taken out of its workspace, and graded all
        the same, so a fix that special-cases the tests it was shown does not pay."""
        try:  # node ids, whatever a task written by older code stored
            failing = node_ids(payload.get("failing_tests") or [], self.baseline(self.repos[payload["repo"]]))
        except PropelError:
            return []  # the grade says why
        count = min(len(failing) - 1, int(self.hidden_failing_tests * len(failing) + 0.5))
        return failing[len(failing) - count :] if count > 0 else []

    def solver_prompt(self, payload: dict[str, Any]) -> Messages:
        repo = self.repos[payload["repo"]]
        hidden = set(self.hidden_tests(payload))
        shown = [test for test in payload.get("failing_tests", []) if test not in hidden][
            : self.max_failing_tests_shown
        ]
        return [
            {"role": "system", "content": agent.SOLVER_SYSTEM.format(workdir=repo.workdir)},
            {"role": "user", "content": agent.SOLVER_TASK.format(repo=repo.name, tests="\n".join(shown))},
        ]

    def solver_episode(self, payload: dict[str, Any], reply: Reply) -> str:
        repo = self.repos[payload["repo"]]
        try:
            with workspace(self.sandbox, repo) as ws:
                problem = apply_diffs(ws, [payload["diff"]]) or hide_tests(ws, self.hidden_tests(payload))
                reset = ws.run(RESET_HISTORY)
                if problem or reset.returncode != 0:
                    return json.dumps({"status": "setup_failed", "detail": problem or reset.stderr[-300:]})
                trajectory = agent.run_episode(
                    ws,
                    self.solver_prompt(payload),
                    reply,
                    agent.SOLVER_TOOLS,
                    self.solver_max_turns,
                    self.solver_budget,
                    self.command_time_limit,
                    self.max_output_chars,
                )
                trajectory["diff"] = agent.final_diff(ws)
        except PropelError as exc:
            return json.dumps({"status": "setup_failed", "detail": str(exc)})
        status = trajectory["stop_reason"] if trajectory["stop_reason"] in ("timeout", "error") else "finished"
        return json.dumps({"status": status, **trajectory})

    def grade(self, payload: dict[str, Any], attempt: str) -> Verdict:
        """Solved iff the attempt's final edit makes every baseline-passing test pass on a clean
        checkout with the bug applied. An episode that ran out of its budget is graded on the edit it
        left, like any other: stalling earns nothing. None (ungradable) only where the harness failed
        (setup, the sandbox)."""
        try:
            record = json.loads(attempt)
        except (ValueError, RecursionError):
            return Verdict(None, "the attempt is not a solver trajectory")
        if not isinstance(record, dict):
            return Verdict(None, "the attempt is not a solver trajectory")
        if record.get("status") not in ("finished", "timeout"):
            return Verdict(None, f"attempt {record.get('status')}: {record.get('detail') or 'no final edit'}")
        if not record.get("diff", "").strip():
            return Verdict(False, "the attempt changed nothing", {"turns": len(record.get("turns", []))})
        repo = self.repos[payload["repo"]]
        baseline = self.baseline(repo)
        try:
            failing = node_ids(payload.get("failing_tests") or [], baseline)
            replay = Replay.model_validate(payload["replay"]) if "replay" in payload else None
        except PropelError as exc:
            return Verdict(None, str(exc))
        except ValidationError as exc:
            return Verdict(None, f"the task's replay cannot be read ({exc.error_count()} problems): verify it again")
        solved, reason, diagnostics = grade_fix(
            self.sandbox,
            repo,
            baseline,
            payload["diff"],
            record["diff"],
            self.clean_sources(repo),
            failing,
            replay,
        )
        if "judged_by" in diagnostics:
            diagnostics["judged_by"]["hidden_from_the_solver"] = self.hidden_tests(payload)
        return Verdict(solved, reason, {**diagnostics, "turns": len(record.get("turns", []))})


def hide_tests(ws, tests: list[str]) -> str | None:
    """Take the test functions ``tests`` (node ids) out of their files in the solver's workspace (their
    decorators and body, the rest of the file as it was); why not, or None."""
    by_file: dict[str, set[str]] = {}
    for test in tests:
        path, _, names = test.partition("::")
        by_file.setdefault(path, set()).add(names.split("::")[-1].split("[")[0])
    for path, names in by_file.items():
        try:
            source = ws.read(path).decode()
            tree = ast.parse(source)
        except (PropelError, OSError, SyntaxError, UnicodeDecodeError, ValueError) as exc:
            return f"could not hide the tests of {path}: {exc}"
        spans = [
            (min([node.lineno, *(d.lineno for d in node.decorator_list)]), node.end_lineno)
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in names
        ]
        lines = source.splitlines(keepends=True)
        for first, last in sorted(spans, reverse=True):
            lines[first - 1 : last] = []
        ws.write(path, "".join(lines).encode())
    return None


def absolute_paths(options: dict[str, Any]) -> dict[str, Any]:
    """Sandbox options with ``python_env`` made absolute (``~`` expanded, a relative path read from
    the working directory, as every path of a config is), so the sandbox binds the folder the user
    meant and the preflight cache names it."""
    if options.get("python_env"):
        options["python_env"] = str(Path(options["python_env"]).expanduser().resolve())
    return options


def check_bug(task: Task, domain: SWE) -> Validity:
    """The ``swe_bug`` predicate: the verifier of ``SWE.verify`` (records the failing tests)."""
    if not isinstance(domain, SWE):
        return Validity.reject("swe_bug checks bugs of the swe domain only")
    return domain.verify(task.payload)
