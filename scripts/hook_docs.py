"""Write docs/plugin_hooks.md from propel_core/hookspecs.py, whose docstrings are the hook reference.

    .venv/bin/python scripts/hook_docs.py

tests/test_docs.py fails while the checked-in page differs from what this renders.
"""

from __future__ import annotations

import inspect
from pathlib import Path

from propel_core import hookspecs

PAGE = Path(__file__).resolve().parent.parent / "docs" / "plugin_hooks.md"
COMMAND = ".venv/bin/python scripts/hook_docs.py"


def hooks() -> list:
    """The hook specs in the order hookspecs.py defines them."""
    return [obj for obj in vars(hookspecs).values() if inspect.isfunction(obj) and hasattr(obj, "propel_spec")]


def signature(hook) -> str:
    """``name(args)``, as the hook's heading shows it."""
    return f"{hook.__name__}{inspect.signature(hook)}"


def render() -> str:
    """The page: a title, the module docstring, then each hook's signature and docstring."""
    parts = ["# Plugin hooks", inspect.getdoc(hookspecs)]
    for hook in hooks():
        parts += [f"## {signature(hook)}", inspect.getdoc(hook)]
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    PAGE.write_text(render())
    print(f"wrote {PAGE}")
