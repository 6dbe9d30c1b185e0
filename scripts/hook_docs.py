"""Write docs/plugin_hooks.md from propel_core/hookspecs.py, whose docstrings are the hook reference.

    .venv/bin/python scripts/hook_docs.py

tests/test_docs.py fails while the checked-in page differs from what this renders.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

from pydantic_core import PydanticUndefined

from propel_core import hookspecs
from propel_core.domain import Verdict
from propel_core.records import Context, Label, SolverAttempt, Task, Validity

PAGE = Path(__file__).resolve().parent.parent / "docs" / "plugin_hooks.md"
COMMAND = ".venv/bin/python scripts/hook_docs.py"


def hooks() -> list:
    """The hook specs in the order hookspecs.py defines them."""
    return [obj for obj in vars(hookspecs).values() if inspect.isfunction(obj) and hasattr(obj, "propel_spec")]


def signature(hook) -> str:
    """``name(args)``, as the hook's heading shows it."""
    return f"{hook.__name__}{inspect.signature(hook)}"


#: the records a plugin reads and returns, documented after the hooks
RECORDS = (Context, Task, Validity, Verdict, SolverAttempt, Label)


def fields_table(record: type) -> str:
    """A record's fields as a table: name, type, default and meaning (pydantic descriptions, or the
    dataclass fields' ``doc`` metadata)."""
    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    if dataclasses.is_dataclass(record):
        entries = [
            (f.name, f.type, _default(f.default, f.default_factory), f.metadata.get("doc", ""))
            for f in dataclasses.fields(record)
        ]
    else:
        entries = [
            (name, info.annotation, _default(info.default, info.default_factory), info.description or "")
            for name, info in record.model_fields.items()
        ]
    for name, annotation, default, meaning in entries:
        kind = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
        kind = kind.replace("|", "\\|")  # a union's bar is no column's end
        rows.append(f"| `{name}` | `{kind}` | {default} | {meaning} |")
    return "\n".join(rows)


def _default(default, factory) -> str:
    if factory not in (None, dataclasses.MISSING):
        return f"`{factory()!r}`"
    if default in (dataclasses.MISSING, PydanticUndefined):
        return "required"
    return f"`{default!r}`"


def render() -> str:
    """The page: a title, the module docstring, each hook's signature and docstring, then the records
    plugins read and return, field by field."""
    parts = ["# Plugin hooks", inspect.getdoc(hookspecs)]
    for hook in hooks():
        parts += [f"## {signature(hook)}", inspect.getdoc(hook)]
    parts += [
        "# Records",
        "What the hooks above read and return (all importable from `propel_core`). Records are pydantic "
        "models that refuse unknown fields; `Verdict` is a dataclass a domain's `grade` returns.",
    ]
    for record in RECORDS:
        parts += [f"## {record.__name__}", inspect.getdoc(record), fields_table(record)]
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    PAGE.write_text(render())
    print(f"wrote {PAGE}")
