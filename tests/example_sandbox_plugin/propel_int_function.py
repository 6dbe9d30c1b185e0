"""An example third-party propel domain that runs the solver's code: the generator describes a small
function from integers to integers and gives examples of it, the solver writes that function in
Python, and the grader runs it in the sandbox on the examples' inputs.

docs/writing_plugins.md ("A domain that runs code") walks through it. The solver's code is hostile:
it only ever runs inside the sandbox, and what comes back is JSON data, compared here as data.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from propel_core import Context, Domain, ParseError, Verdict, hookimpl


@hookimpl
def register_domains(register):
    register("int_function", IntFunction)


THEMES = ("digits", "squares", "parity", "divisors", "remainders")
EXAMPLES = {
    "digits": "Function: f(n) returns the sum of the digits of n\nf(123) = 6\nf(40) = 4\nf(7) = 7\nf(1000) = 1",
    "squares": "Function: f(n) returns n times n plus one\nf(2) = 5\nf(0) = 1\nf(-3) = 10\nf(10) = 101",
    "parity": "Function: f(n) returns 1 if n is odd, else 0\nf(3) = 1\nf(8) = 0\nf(-5) = 1\nf(0) = 0",
}
PREFILL = "Function: f(n) returns"
SPEC = re.compile(r"Function:[ \t]*(.+)")
EXAMPLE_LINE = re.compile(r"^[ \t]*f\((-?\d{1,9})\)[ \t]*=[ \t]*(-?\d{1,18})[ \t]*$", re.MULTILINE)
CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)

# Runs inside the sandbox, never in propel's process: loads the solver's code, calls its f on each
# input and writes what came back to result.json. The expected outputs never enter the sandbox; the
# grader compares what comes back with them, outside it.
DRIVER = """\
import json

with open("inputs.json") as handle:
    inputs = json.load(handle)
namespace = {"__name__": "solution"}
with open("solution.py") as handle:
    exec(compile(handle.read(), "solution.py", "exec"), namespace)
outputs = []
for n in inputs:
    try:
        value = namespace["f"](n)
    except Exception as exc:
        outputs.append({"error": type(exc).__name__})
        continue
    outputs.append({"value": value} if type(value) is int else {"error": "returned " + type(value).__name__})
with open("result.json", "w") as handle:
    json.dump({"outputs": outputs}, handle)
"""


class IntFunction(Domain):
    # sandbox_options holds the options of the sandbox that the option sandbox names: reading the
    # config checks them against that sandbox's own parameters
    component_options: ClassVar[dict[str, tuple[str, str]]] = {"sandbox_options": ("sandboxes", "sandbox")}

    def __init__(
        self,
        min_examples: int = 3,
        shown: int = 2,
        time_limit: float = 2.0,
        sandbox: str = "local",
        sandbox_options: dict[str, Any] | None = None,
    ):
        if not 0 < shown < min_examples:
            raise ValueError(f"shown ({shown}) must be at least 1 and less than min_examples ({min_examples})")
        self.min_examples, self.shown, self.time_limit = min_examples, shown, time_limit
        # the sandbox these name is self.sandbox, made on first use (Domain.sandbox)
        self.sandbox_name, self.sandbox_options = sandbox, dict(sandbox_options or {})

    def contexts(self):
        return [Context(id=f"theme-{theme}", data={"theme": theme}) for theme in THEMES]

    def generator_prompt(self, context):
        theme = context.data["theme"]
        examples = "\n\n".join(text for name, text in EXAMPLES.items() if name != theme)
        return [
            {
                "role": "user",
                "content": f"Describe a small function f(n) from integers to integers, about {theme}, in one "
                f"line, then give {self.min_examples + 1} examples of it, one per line. Examples:\n\n"
                f"{examples}\n\nReply in the same format.",
            },
            {"role": "assistant", "content": PREFILL},
        ]

    def parse(self, generation):
        spec = SPEC.search(generation)
        if spec is None or not spec.group(1).strip():
            raise ParseError("no 'Function:' line")
        if len(spec.group(1)) > 200:
            raise ParseError("the description is longer than 200 characters")
        examples = {}
        for n, value in EXAMPLE_LINE.findall(generation):
            if examples.setdefault(int(n), int(value)) != int(value):
                raise ParseError(f"two different outputs for f({n})")
        if len(examples) < self.min_examples:
            raise ParseError(f"{len(examples)} examples with distinct inputs, need {self.min_examples}")
        return {"description": spec.group(1).strip(), "examples": [[n, value] for n, value in examples.items()]}

    def render(self, payload):
        return "\n".join([payload["description"], *(f"f({n}) = {value}" for n, value in payload["examples"])])

    def solver_prompt(self, payload):
        shown = "\n".join(f"f({n}) = {value}" for n, value in payload["examples"][: self.shown])
        return [
            {
                "role": "user",
                "content": f"Write a Python function f(n) that takes an integer and returns an integer: "
                f"{payload['description']}. For example:\n{shown}\n"
                "Answer with one ```python code block that defines f.",
            }
        ]

    def grade(self, payload, attempt):
        blocks = CODE_BLOCK.findall(attempt)
        if not blocks:
            return Verdict(False, "no Python code block")
        inputs = [n for n, _ in payload["examples"]]
        files = {"main.py": DRIVER, "solution.py": blocks[-1], "inputs.json": json.dumps(inputs)}
        run = self.sandbox.run_python(files, "main.py", time_limit=self.time_limit)
        diagnostics = {"sandbox_status": run.status}
        if run.status == "sandbox_error":  # the sandbox failed, not the attempt: ungradable
            return Verdict(None, f"sandbox_error: {why(run)}", diagnostics)
        if run.status != "ok":  # error, timeout, oom, output_limit, disk_limit, crashed, no_result
            return Verdict(False, f"{run.status}: {why(run)}", diagnostics)
        outputs = read_outputs(run.result, len(inputs))
        if outputs is None:
            return Verdict(False, "malformed result", diagnostics)
        wrong = []
        for (n, expected), got in zip(payload["examples"], outputs, strict=True):
            if "error" in got:
                wrong.append(f"f({n}) raised {got['error'][:80]}")
            elif got["value"] != expected:
                value = got["value"] if abs(got["value"]) < 10**18 else "a larger number"
                wrong.append(f"f({n}) = {value}, expected {expected}")
        diagnostics["matched"] = len(inputs) - len(wrong)
        if wrong:
            return Verdict(False, f"{len(wrong)} of {len(inputs)} examples wrong; first: {wrong[0]}", diagnostics)
        return Verdict(True, None, diagnostics)


def read_outputs(result: Any, count: int) -> list[dict[str, Any]] | None:
    """The ``count`` entries of a sandbox's result, each ``{"value": an int}`` or ``{"error": a
    string}``; None when the result has any other shape (the solver's code may have written it)."""
    if not isinstance(result, dict) or result.keys() != {"outputs"} or not isinstance(result["outputs"], list):
        return None
    outputs = result["outputs"]
    if len(outputs) != count:
        return None
    for entry in outputs:
        if not isinstance(entry, dict) or not (
            (entry.keys() == {"value"} and type(entry["value"]) is int)
            or (entry.keys() == {"error"} and type(entry["error"]) is str)
        ):
            return None
    return outputs


def why(run: Any) -> str:
    """A short reason for a run that did not end ``ok``: the sandbox's ``detail``, else the end of the
    run's stderr (a sandbox written before the contract, ``propel_core.Outcome``, promised ``detail``
    may lack it)."""
    return str(getattr(run, "detail", None) or run.stderr.strip()[-200:] or "no detail")[:200]
