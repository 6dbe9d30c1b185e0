"""The verifier tried on a repository before anyone trains on it: are its bugs accepted and its fixes
solved for what they do, not for how the repository is laid out or how a fix is written?

``survey`` plants the repository's first procedural bugs and verifies each; every valid bug's exact
revert must solve it, a change that does nothing (a comment) and an edit of a file that is not code
(the README) must not, and on the first valid bug the revert written in each ordinary shape of fix
(``FIX_SHAPES``: a module-level ``re.compile``, an ``object()`` sentinel, a new standard import, an
``lru_cache`` decorator, a dataclass, a docstring that mentions pytest, one more ``@property``) must
solve it too. ``propel swe verdicts CONFIG`` prints the survey; the tests run it on four repositories
from PyPI (tests/test_real_repos.py), and ``benchmarks/swe_repos.py`` on five (docs/swe.md).
"""

from __future__ import annotations

import ast
import json
import time
from typing import Any

from propel_core import Context, ParseError
from propel_swe.procedural import unified_diff
from propel_swe.replay import Replay
from propel_swe.verifier import apply_diffs, workspace

#: name -> (the standard import it needs, code appended to the file the bug is in)
FIX_SHAPES = {
    "module_level_compile": ("import re", '_WORD = re.compile(r"\\w+")'),
    "sentinel": ("", "_MISSING = object()"),
    "import_inspect": ("import inspect", "_SIGNATURE = inspect.signature"),
    "import_types": ("import types", "_EMPTY = types.MappingProxyType({})"),
    "lru_cache_decorator": ("import functools", "@functools.lru_cache(maxsize=None)\ndef _sq(x):\n    return x * x"),
    "dataclass": ("import dataclasses", "@dataclasses.dataclass\nclass _Point:\n    x: int = 0\n    y: int = 0"),
    "docstring_naming_pytest": ("", 'def _helper():\n    """Covered by the pytest suite."""\n    return None'),
    "one_more_property": ("", "class _Box:\n    @property\n    def size(self):\n        return 0"),
}


def shaped(source: str, shape: str) -> str:
    """``source`` with fix shape ``shape`` added: its import after the docstring and any
    ``from __future__`` import, its code at the end."""
    imports, code = FIX_SHAPES[shape]
    lines = source.splitlines(keepends=True)
    if imports:
        body = ast.parse(source).body
        after = 0
        for statement in body:
            docstring = isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
            future = isinstance(statement, ast.ImportFrom) and statement.module == "__future__"
            if not (docstring and after == 0) and not future:
                break
            after = statement.end_lineno
        lines.insert(after, imports + "\n")
    text = "".join(lines)
    return text + ("" if text.endswith("\n") else "\n") + "\n\n" + code + "\n"


def survey(domain, repo_name: str, bugs: int, shapes: bool = True, progress=None) -> dict[str, Any]:
    """Verify the first ``bugs`` procedural bugs of ``repo_name`` (the domain's mutants in the order
    seeded 0) and grade the fixes described above; ``progress(1)`` after each bug. Returns counts
    (``replayed``: valid bugs with calls a fix is also judged on outside the tests; ``unjudged``: those
    of them whose code changed none of those calls' answers, kept on the other layers' judgment), each bug's
    verdicts and the seconds spent."""
    repo = domain.repos[repo_name]
    started = time.monotonic()
    rows, shaped_fixes = [], {}
    readme_edit = _readme_edit(domain, repo)  # the same for every bug
    for number in range(bugs):
        context = Context(id=repo.name, data={"repo": repo.name, "mutant": number, "mutant_seed": 0})
        try:  # the domain's own procedural episode, whatever generator its run uses
            payload = domain.parse(json.dumps(domain.procedural_episode(repo, context, 0)))
        except ParseError:  # no mutant left: the repository has fewer distinct bugs than asked for
            break
        validity = domain.verify(payload)
        row = {"bug": payload["turns"][0].splitlines()[0], "valid": validity.valid, "reason": validity.reason}
        replay = Replay.model_validate(payload["replay"]) if "replay" in payload else Replay()
        row["replayed"], row["unjudged"] = replay.judged, replay.changed == 0
        if validity.valid:
            path = domain.topic(payload).split(":", 1)[1]
            clean = domain.clean_sources(repo)[path]
            with workspace(domain.sandbox, repo) as ws:
                apply_diffs(ws, [payload["diff"]])
                buggy = ws.read(path).decode()
            fixes = {
                "revert": unified_diff(path, buggy, clean),
                "no_op": unified_diff(path, buggy, buggy + "\n# the same code\n"),
                "readme_edit": readme_edit,
            }
            if shapes and not shaped_fixes:
                fixes.update({f"shape:{name}": unified_diff(path, buggy, shaped(clean, name)) for name in FIX_SHAPES})
                shaped_fixes = fixes
            row["fixes"] = {name: _grade(domain, payload, fix) for name, fix in fixes.items() if fix}
        rows.append(row)
        if progress is not None:
            progress(1)
    valid = [row for row in rows if row["valid"]]

    def count(name: str, solved: bool | None) -> int:
        return sum(row["fixes"].get(name, {}).get("solved") is solved for row in valid if name in row["fixes"])

    return {
        "repo": repo.name,
        "bugs": len(rows),
        "valid": len(valid),
        "replayed": sum(row["replayed"] > 0 for row in valid),
        "unjudged": sum(row["unjudged"] for row in valid),
        "reverts_solved": count("revert", True),
        "no_ops_solved": count("no_op", True),
        "readme_edits_solved": count("readme_edit", True),
        "shapes_solved": {shape: count(f"shape:{shape}", True) for shape in FIX_SHAPES} if shaped_fixes else {},
        "seconds": round(time.monotonic() - started, 1),
        "rows": rows,
    }


def _grade(domain, payload: dict, fix: str) -> dict[str, Any]:
    attempt = {"diff": fix, "stop_reason": "stop", "status": "finished", "turns": []}
    verdict = domain.grade(payload, json.dumps(attempt))
    return {"solved": verdict.solved, "reason": verdict.reason}


def _readme_edit(domain, repo) -> str | None:
    """A fix that edits the README (or another tracked file that is not code), which changes nothing
    the tests run."""
    with workspace(domain.sandbox, repo) as ws:
        listed = ws.run("git ls-files -z").stdout.split("\0")
        readme = next((path for path in listed if path.lower().startswith("readme")), None)
        if readme is None:
            return None
        text = ws.read(readme).decode(errors="replace")
    return unified_diff(readme, text, text + "\nThe bug is fixed.\n")
