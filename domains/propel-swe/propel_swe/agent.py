"""The agent harness: a model acts in a sandboxed repository through tools, one call per turn.

A reply calls a tool with a fenced block whose info string names it::

    ```bash
    grep -rn "def parse" src/
    ```

Tools: ``bash`` (a command in the workspace), ``browse`` (the tracked files), ``show`` (``path
[start end]``: numbered lines), ``edit`` (a path, then ``<<<<<<< SEARCH`` / ``=======`` /
``>>>>>>> REPLACE`` with text that must occur exactly once) and ``submit`` (the episode ends). The
bug writer gets ``bash`` and ``submit``; the solver all five. Stop reasons: ``stop`` (submitted),
``max_turns``, ``length`` (a reply ended inside an open tool call: cut at the per-turn token limit),
``timeout`` (the episode's budget: the time its commands took, judged as the sandbox judges a run's,
so a busy machine does not shorten an episode; the turn cap bounds the model's replies), ``error``
(the sandbox failed). The trajectory keeps
every assistant turn and every tool result.
"""

from __future__ import annotations

import re
import secrets
import shlex
import time
from collections.abc import Callable
from typing import Any

from propel_core import PropelError
from propel_plugins.sandbox import OUT_DIR
from propel_swe.verifier import own_seconds

BUG_WRITER_TOOLS = ("bash", "submit")
SOLVER_TOOLS = ("browse", "show", "edit", "bash", "submit")
CALL = re.compile(r"```([a-z]+)[ \t]*\n(.*?)```", re.DOTALL)
EDIT = re.compile(r"<<<<<<< SEARCH\n(.*?)\n?=======\n(.*?)\n?>>>>>>> REPLACE", re.DOTALL)
DIFF_COMMAND = "git add -A -N . >/dev/null 2>&1; git -c core.fsmonitor= diff --no-ext-diff --no-textconv --binary HEAD"

BUG_WRITER_SYSTEM = """\
You are a software engineer with shell access to a Python repository at {workdir}. Your job is to \
plant one realistic bug: a small change to the source code that changes behaviour so that at least \
one existing test fails, the kind of mistake a person could make. Rules: never edit tests, conftest.py, \
test or packaging configuration, or anything under .git; the test suite must still import and run; \
do not delete or skip tests. Work in small steps. Each reply holds exactly one tool call:

```bash
<one shell command>
```

Run the tests to check your bug. When you are done, reply with an empty submit block:

```submit
```"""

BUG_WRITER_TASK = "Repository: {repo}. Explore it, choose a function worth breaking, change it, and submit."

SOLVER_SYSTEM = """\
You fix bugs in a Python repository at {workdir}. Each reply holds exactly one tool call, a fenced \
block named after the tool:
- ```browse``` lists the tracked files;
- ```show``` with `path [start end]` prints numbered lines;
- ```edit``` with a path on the first line, then
<<<<<<< SEARCH
exact old text
=======
new text
>>>>>>> REPLACE
- ```bash``` runs one shell command;
- ```submit``` ends your attempt.
Do not change the tests."""

SOLVER_TASK = "Repository: {repo}. These tests fail and passed before the bug:\n{tests}\nFind the bug and fix it."


def tool_call(text: str, tools: tuple[str, ...]) -> tuple[str, str] | None:
    """The first fenced block naming one of ``tools``: (tool, body)."""
    for match in CALL.finditer(text):
        if match.group(1) in tools:
            return match.group(1), match.group(2)
    return None


def run_episode(
    ws,
    messages: list[dict[str, str]],
    reply: Callable[[list[dict[str, str]]], str],
    tools: tuple[str, ...],
    max_turns: int,
    budget: float,
    command_time_limit: float,
    max_output_chars: int = 4000,
) -> dict[str, Any]:
    """Run the conversation until submit, the turn cap, a cut reply, the budget or a sandbox failure.
    Returns the trajectory: ``messages`` (all of them), ``turns`` (one entry per assistant turn with
    its tool, tool result and exit code), ``stop_reason`` and ``seconds``."""
    started, spent = time.monotonic(), 0.0  # spent: what the commands took, in their own time
    turns: list[dict[str, Any]] = []
    stop = "max_turns"
    for _ in range(max_turns):
        remaining = budget - spent
        if remaining <= 0:
            stop = "timeout"
            break
        text = reply(messages)
        messages.append({"role": "assistant", "content": text})
        call = tool_call(text, tools)
        turn: dict[str, Any] = {"assistant": text, "tool": call[0] if call else None}
        turns.append(turn)
        if call is None:
            if text.count("```") % 2:
                stop = "length"
                break
            observation = f"No tool call found. Reply with one fenced block named after a tool: {', '.join(tools)}."
        elif call[0] == "submit":
            stop = "stop"
            break
        else:
            observation, status, seconds = execute(ws, call, min(command_time_limit, remaining), max_output_chars)
            spent += seconds
            turn["status"] = status
            if status == "sandbox_error":
                turn["output"] = observation
                stop = "error"
                break
            if status == "timeout" and remaining <= command_time_limit:  # it ran out of the episode's time
                turn["output"] = observation
                stop = "timeout"
                break
        turn["output"] = observation
        messages.append({"role": "user", "content": observation})
    return {"messages": messages, "turns": turns, "stop_reason": stop, "seconds": time.monotonic() - started}


def execute(ws, call: tuple[str, str], time_limit: float, max_output_chars: int) -> tuple[str, str, float]:
    """Run one tool call; (the observation the model sees, the sandbox status, the seconds it took as
    the sandbox judges a run's time: none for the tools the harness serves itself). Whatever the call's
    text makes a tool raise (an unclosed quote, a digit ``int`` cannot read, a file that is not
    UTF-8) is the model's error, shown to it like any other; it never ends the episode."""
    tool, body = call
    try:
        if tool == "bash":
            result = ws.run(body, time_limit=time_limit)
        elif tool == "browse":
            result = ws.run("git ls-files | head -n 500", time_limit=time_limit)
        elif tool == "show":
            return _show(ws, body), "ok", 0.0
        else:  # edit
            return _edit(ws, body), "ok", 0.0
    except Exception as exc:
        return f"error: {type(exc).__name__}: {str(exc)[:300]}", "error", 0.0
    output, seconds = (result.stdout + result.stderr)[-max_output_chars:], own_seconds(result)
    if result.status == "timeout":
        return f"(timed out after {time_limit:.0f} s)\n{output}", result.status, seconds
    if result.status == "sandbox_error":
        return f"(sandbox failed: {result.detail})", result.status, seconds
    return f"exit code {result.returncode}\n{output}", result.status, seconds


def _show(ws, body: str) -> str:
    words = shlex.split(body.strip())
    if not words:
        return "show needs a path"
    lines = ws.read(words[0]).decode(errors="replace").splitlines()
    start = int(words[1]) if len(words) > 1 and words[1].isdigit() else 1
    end = int(words[2]) if len(words) > 2 and words[2].isdigit() else min(len(lines), start + 99)
    return "\n".join(f"{n:5d}  {lines[n - 1]}" for n in range(max(start, 1), min(end, len(lines)) + 1))


def _edit(ws, body: str) -> str:
    path, _, rest = body.partition("\n")
    blocks = EDIT.findall(rest)
    if not path.strip() or not blocks:
        return "edit needs a path on the first line and at least one SEARCH/REPLACE block"
    text = ws.read(path.strip()).decode()
    for old, new in blocks:
        count = text.count(old)
        if count != 1:
            return f"the SEARCH text occurs {count} times in {path.strip()}; it must occur exactly once"
        text = text.replace(old, new)
    ws.write(path.strip(), text.encode())
    return f"edited {path.strip()}"


def final_diff(ws) -> str:
    """Everything the episode changed in the checkout, new files included, as a git diff; bytes that
    are no UTF-8 (a line of a Latin-1 file) as lone surrogates, which ``apply_diffs`` writes back as
    those bytes."""
    out = f"{OUT_DIR}/final-{secrets.token_hex(8)}.diff"
    result = ws.run(f"mkdir -p {OUT_DIR}; {DIFF_COMMAND} > {out}")
    if result.status not in ("ok", "error"):
        return ""
    try:
        return ws.read(out).decode("utf-8", "surrogateescape")
    except (OSError, PropelError):  # the episode's commands left no diff to read
        return ""
