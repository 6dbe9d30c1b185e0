"""AZR code induction (Absolute Zero format): the generator writes a function f, inputs and a hint;
the solver sees five input/output pairs and the hint and must reproduce f on five hidden inputs.

Everything a model writes runs only in the sandbox; what comes back is parsed JSON, compared as data.
"""

from __future__ import annotations

import ast
import json
import re
import string
from importlib.resources import files
from typing import Any, ClassVar

from propel_azr.topics import topic_of
from propel_core import Context, Domain, Messages, ParseError, Task, Validity, Verdict, hookimpl


@hookimpl
def register_domains(register):
    register("azr", AZR)


@hookimpl
def register_validity_predicates(register):
    register("azr_static", check_static)
    register("azr_execution", check_execution)


ALLOWED_IMPORTS = frozenset({"math", "string", "itertools", "collections", "functools", "re", "heapq", "bisect"})
BANNED_NAMES = frozenset(
    {"eval", "exec", "compile", "open", "__import__", "globals", "locals", "vars", "getattr", "setattr", "delattr",
     "input", "breakpoint", "exit", "quit", "help", "memoryview", "__builtins__", "print"}
)  # fmt: skip

# attribute and imported names that lead from an allowed module or a value to the rest of the
# interpreter (modules, processes, the import system, frames) or to string formatting's attribute
# traversal; a name starting with "_" is refused as well, whatever it is
BANNED_ATTRIBUTES = frozenset(
    {"sys", "os", "posix", "nt", "builtins", "subprocess", "importlib", "shutil", "socket", "ctypes", "signal",
     "pty", "runpy", "inspect", "gc", "marshal", "pickle", "enum", "copyreg", "typing", "types", "warnings",
     "weakref", "threading", "linecache", "tempfile", "pathlib", "io", "system", "popen", "spawnv", "spawnl",
     "fork", "forkpty", "execv", "execve", "execl", "execlp", "execvp", "kill", "environ", "putenv", "modules",
     "import_module", "load_module", "exec_module", "find_spec", "loader", "reload", "eval", "exec", "open",
     "getattr", "setattr", "delattr", "globals", "locals", "vars", "breakpoint", "mro", "f_globals",
     "f_builtins", "f_locals", "f_back", "f_code", "gi_frame", "gi_code", "cr_frame", "cr_code", "ag_frame",
     "ag_code", "tb_frame", "tb_next", "func_globals", "Formatter", "get_field", "get_value", "vformat"}
)  # fmt: skip
FORMAT_METHODS = frozenset({"format", "format_map"})
GRADER_HASH_SEED = 0  # the hash seed the grader runs every attempt with
VALIDITY_TIME_SHARE = 0.5  # validity's run as graded gets this share of the grader's time limit

SECTION = {name: re.compile(rf"<{name}>(.*?)</{name}>", re.DOTALL) for name in ("code", "inputs", "message")}
CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)

# Runs inside the sandbox: executes the candidate, then calls f on each input in a process of its own,
# forked before any call, so no call sees what another left behind (a mutable default, a changed
# module) and an output cannot depend on which inputs, or how many, were called before; keeps plain
# data only. The inputs file is gone before the candidate runs.
DRIVER = """\
import json
import math
import os


def plain(value, depth=0):
    kind = type(value)  # exact types: subclasses with their own __eq__ or __repr__ are refused
    if depth > 32:
        raise TypeError("output nested too deeply")
    if value is None or kind is bool or kind is int or kind is str:
        return value
    if kind is float:
        if not math.isfinite(value):
            raise TypeError("non-finite float")
        return value
    if kind is list or kind is tuple:
        return [plain(item, depth + 1) for item in value]
    if kind is dict and all(type(key) is str for key in value):
        return {key: plain(item, depth + 1) for key, item in value.items()}
    raise TypeError("output of type " + kind.__name__ + " is not plain data")


def call(args):
    try:
        return {"value": plain(f(*args))}
    except Exception as exc:
        return {"error": type(exc).__name__}


def in_a_process_of_its_own(args):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        data = json.dumps(call(args)).encode()
        while data:
            data = data[os.write(write, data):]
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks)) if chunks else {"error": "the call's process died"}


with open("inputs.json") as handle:
    inputs = json.load(handle)
os.remove("inputs.json")
with open("candidate.py") as handle:
    source = handle.read()
namespace = {"__name__": "candidate"}
exec(compile(source, "candidate.py", "exec"), namespace)
f = namespace["f"]
outputs = [in_a_process_of_its_own(args) for args in inputs]
with open("result.json", "w") as handle:
    json.dump({"outputs": outputs}, handle)
"""


class AZR(Domain):
    """Function induction over small pure Python functions."""

    validity_predicates = ("azr_static", "azr_execution")
    component_options: ClassVar[dict[str, tuple[str, str]]] = {"sandbox_options": ("sandboxes", "sandbox")}

    def __init__(
        self,
        min_inputs: int = 10,
        shown: int = 5,
        hidden: int = 5,
        max_code_chars: int = 4000,
        sandbox: str = "local",
        sandbox_options: dict[str, Any] | None = None,
    ):
        if shown + hidden > min_inputs:
            raise ValueError(f"shown ({shown}) + hidden ({hidden}) must not exceed min_inputs ({min_inputs})")
        self.min_inputs, self.shown, self.hidden = min_inputs, shown, hidden
        self.max_code_chars = max_code_chars
        self.sandbox_name = sandbox
        self.sandbox_options = {"time_limit": 5.0, "memory_mb": 256, **(sandbox_options or {})}

    def contexts(self) -> list[Context]:
        seeds = files("propel_azr").joinpath("seeds.jsonl").read_text().splitlines()
        return [Context(id=f"azr-seed-{i:02d}", data=json.loads(line)) for i, line in enumerate(seeds)]

    def generator_prompt(self, context: Context) -> Messages:
        seed = context.data
        example_inputs = "\n".join(json.dumps(args) for args in seed["inputs"])
        return [
            {
                "role": "user",
                "content": (
                    "Write a puzzle for a programmer: a small, deterministic Python function named f, a list of "
                    "inputs for it, and a one-sentence hint. Another programmer will see some inputs with f's "
                    "outputs plus your hint and must write f again, so f should be learnable from examples but "
                    "not trivial. Use only the standard library (math, string, itertools, collections, "
                    "functools, re, heapq, bisect); no printing, files, randomness or time.\n\n"
                    "Here is an example of the format (it shows 3 inputs):\n\n"
                    f"<code>\n{seed['code']}\n</code>\n<inputs>\n{example_inputs}\n</inputs>\n"
                    "<message>...</message>\n\n"
                    f"Write a new, different function in the same format with at least {self.min_inputs} inputs, "
                    "one per line, each a JSON list of f's arguments."
                ),
            },
            {"role": "assistant", "content": "<code>\ndef f("},
        ]

    def parse(self, generation: str) -> dict[str, Any]:
        sections = {}
        for name, pattern in SECTION.items():
            match = pattern.search(generation)
            if match is None:
                raise ParseError(f"no <{name}> section")
            sections[name] = match.group(1).strip()
        if len(sections["code"]) > self.max_code_chars:
            raise ParseError(f"code longer than {self.max_code_chars} characters")
        if "```" in sections["code"]:  # a solver could not hand the same f back in a code block
            raise ParseError("the code holds a Markdown fence (```)")
        inputs = []
        for line in sections["inputs"].splitlines():
            if not line.strip():
                continue
            try:
                args = json.loads(line)
            except ValueError:
                raise ParseError("an input line is not JSON") from None
            if not isinstance(args, list):
                raise ParseError("an input line is not a JSON list of arguments")
            if args not in inputs:
                inputs.append(args)
        if len(inputs) < self.min_inputs:
            raise ParseError(f"{len(inputs)} distinct inputs, need at least {self.min_inputs}")
        if not sections["message"] or len(sections["message"]) > 500:
            raise ParseError("the message must be 1-500 characters")
        return {"code": sections["code"], "inputs": inputs[: self.shown + self.hidden], "message": sections["message"]}

    def render(self, payload: dict[str, Any]) -> str:
        inputs = "\n".join(json.dumps(args) for args in payload["inputs"])
        code, message = payload["code"], payload["message"]
        return f"<code>\n{code}\n</code>\n<inputs>\n{inputs}\n</inputs>\n<message>{message}</message>"

    def solver_prompt(self, payload: dict[str, Any]) -> Messages:
        examples = "\n".join(
            f"f({', '.join(map(repr, args))}) == {output!r}"
            for args, output in zip(payload["inputs"][: self.shown], payload["outputs"][: self.shown], strict=True)
        )
        return [
            {
                "role": "user",
                "content": (
                    f"A hidden Python function f behaves like this:\n{examples}\n\nHint: {payload['message']}\n\n"
                    "Write f so that it behaves the same on other inputs. Answer with one Python code block "
                    "defining f."
                ),
            }
        ]

    def grade(self, payload: dict[str, Any], attempt: str) -> Verdict:
        blocks = CODE_BLOCK.findall(attempt)
        diagnostics = {"missing_code": not blocks, "multiple_code_blocks": len(blocks) > 1}
        if not blocks:
            return Verdict(False, "no code block", diagnostics)
        hidden_inputs, expected = self.hidden_part(payload["inputs"]), self.hidden_part(payload["outputs"])
        run = self.execute(blocks[-1], hidden_inputs)
        diagnostics["sandbox_status"] = run.status
        if run.status == "sandbox_error":
            return Verdict(None, f"sandbox_error: {run.detail}", diagnostics)  # our failure, not the solver's
        if not run.ok:
            return Verdict(False, f"{run.status}: {run.detail}", diagnostics)
        outputs, problem = _outputs(run.result, len(hidden_inputs))
        if problem:
            return Verdict(False, problem, diagnostics)
        matched = sum(_same(got, want) for got, want in zip(outputs, expected, strict=True))
        diagnostics["matched"] = matched
        solved = matched == len(expected)
        return Verdict(solved, None if solved else f"{matched}/{len(expected)} hidden outputs match", diagnostics)

    def topic(self, payload: dict[str, Any]) -> str:
        return topic_of(payload["code"])

    def hidden_part(self, items: list) -> list:
        """The part of a task's inputs (or outputs) the grader checks: the ``hidden`` after the shown."""
        return items[self.shown : self.shown + self.hidden]

    def execute(
        self, code: str, inputs: list[list], hash_seed: int = GRADER_HASH_SEED, time_limit: float | None = None
    ):
        """Run ``code``'s f on ``inputs`` in the sandbox, each call in a process of its own. The code
        runs as one canonical text (stripped, one final newline), so a task's own f and the same f
        in a solver's code block are the same bytes, laid out the same way in memory."""
        program = {"main.py": DRIVER, "candidate.py": code.strip() + "\n", "inputs.json": json.dumps(inputs)}
        return self.sandbox.run_python(program, "main.py", hash_seed=hash_seed, time_limit=time_limit)


def _outputs(result: Any, count: int) -> tuple[list[Any], str | None]:
    """The plain outputs in a sandbox result, or why there are none."""
    if not isinstance(result, dict) or not isinstance(result.get("outputs"), list) or len(result["outputs"]) != count:
        return [], "malformed result"
    outputs = []
    for entry in result["outputs"]:
        if not isinstance(entry, dict) or not ({"value"} == entry.keys() or {"error"} == entry.keys()):
            return [], "malformed result"
        if "error" in entry:
            return [], f"f raised {str(entry['error'])[:80]} on an input"
        outputs.append(entry["value"])
    return outputs, None


def _same(a: Any, b: Any) -> bool:
    """Equality as data, strict about types (True is not 1, 1 is not 1.0)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def check_static(task: Task, domain: AZR) -> Validity:
    """A quality filter (never the security boundary): one function f, allowed imports, no escapes.

    Besides banned names it refuses the cheap routes from an allowed module to the rest of the
    interpreter: any attribute or imported name starting with ``_`` (``collections._sys``), names of
    other modules and of process, import or frame machinery (``re.enum.sys``, ``gen.gi_frame``), and
    string formatting that walks attributes: ``Formatter``, ``format``/``format_map`` on a computed
    format string or one whose fields contain ``.`` or ``[``, and any string literal containing ``__``.
    Every identifier a program can write is checked, wherever the grammar puts it: an attribute
    named in a ``match`` class pattern (``case object(__class__=t)``) or as a keyword argument by the
    attribute rules, a parameter, an import alias, a name bound by ``except`` or a pattern by the
    name rules.
    """
    try:
        tree = ast.parse(task.payload["code"])
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return Validity.reject("the code does not parse")
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
    if len(functions) != 1 or functions[0].name != "f" or isinstance(functions[0], ast.AsyncFunctionDef):
        return Validity.reject("must define exactly one top-level function, f")
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef | ast.Import | ast.ImportFrom):
            return Validity.reject(f"top-level {type(node).__name__} statement outside f")
    if _binds(tree, "str"):
        return Validity.reject("binds the name str (str.format must be the built-in's)")
    checked_formats: set[int] = set()  # format/format_map attributes whose call was checked
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            problem = _check_import(node)
            if problem:
                return Validity.reject(problem)
        for name, role in _identifiers(node):
            if problem := _identifier_problem(name, role):
                return Validity.reject(problem)
        if isinstance(node, ast.Attribute) and node.attr in FORMAT_METHODS and id(node) not in checked_formats:
            return Validity.reject(f"uses {node.attr} other than called on a format string")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FORMAT_METHODS:
            problem = _check_format_call(node)
            if problem:
                return Validity.reject(problem)
            checked_formats.add(id(node.func))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str | bytes) and "__" in str(node.value):
            return Validity.reject("a string literal contains __")
        elif isinstance(node, ast.Global | ast.Nonlocal):
            return Validity.reject("uses global state")
    return Validity.ok()


def _identifiers(node: ast.AST) -> list[tuple[str, str]]:
    """Every identifier ``node`` itself writes, each with its role: ``attribute`` where it names an
    attribute of some object (``x.attr``, a class pattern's keyword, a keyword argument), ``name``
    where it names a variable (a name, a parameter, an import alias, what ``except``/``as`` or a
    pattern binds), ``definition`` for the name a ``def`` or ``class`` binds. Module paths are
    ``_check_import``'s."""
    if isinstance(node, ast.Name):
        return [(node.id, "name")]
    if isinstance(node, ast.Attribute):
        return [(node.attr, "attribute")]
    if isinstance(node, ast.MatchClass):
        return [(attr, "attribute") for attr in node.kwd_attrs]
    if isinstance(node, ast.keyword):
        return [(node.arg, "attribute")] if node.arg else []
    if isinstance(node, ast.FunctionDef | ast.ClassDef):
        return [(node.name, "definition")]
    names = []
    for field in ("arg", "name", "asname", "rest"):
        value = getattr(node, field, None)
        if isinstance(value, str) and not (isinstance(node, ast.alias) and field == "name"):
            names.append((value, "name"))
    return names


def _binds(tree: ast.AST, name: str) -> bool:
    """Whether the program binds ``name`` anywhere: an assignment, a parameter, an import, a ``def`` or
    ``class``, what ``except``, ``for``, ``with`` or a pattern binds."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            continue
        if isinstance(node, ast.alias) and (node.asname or node.name) == name:
            return True
        if any(found == name for found, _ in _identifiers(node)):
            return True
    return False


def _identifier_problem(name: str, role: str) -> str | None:
    """Why an identifier in that role is refused, or None. A definition may carry a data-model name
    (``def __init__``, ``def __lt__`` in a class): that names no attribute it could reach."""
    if role == "definition" and name.startswith("__") and name.endswith("__") and len(name) > 4:
        return None
    if role in ("name", "definition"):
        if name in BANNED_NAMES or name.startswith("__"):
            return f"uses the banned name {name}"
        return None
    if name.startswith("__"):
        return f"uses the dunder attribute {name}"
    if name.startswith("_"):
        return f"uses the private attribute {name}"
    if name in BANNED_ATTRIBUTES:
        return f"uses the banned attribute {name}"
    return None


def _check_import(node: ast.Import | ast.ImportFrom) -> str | None:
    """Why an import is refused: a module outside the allowed set, or a private or banned name."""
    if isinstance(node, ast.Import):
        modules = [alias.name for alias in node.names]
    else:
        modules = ["." * node.level + (node.module or "")]
    for module in modules:
        if module.split(".")[0] not in ALLOWED_IMPORTS:
            return f"imports a module outside the allowed set: {module}"
        if any(part.startswith("_") for part in module.split(".")):
            return f"imports the private module {module}"
    names = [alias.name for alias in node.names] if isinstance(node, ast.ImportFrom) else []
    if "*" in names:
        return f"imports every name of {modules[0]} (name what you import)"
    for name in names:
        if name.startswith("_") or name in BANNED_ATTRIBUTES:
            return f"imports the banned name {name} from {modules[0]}"
    return None


def _check_format_call(call: ast.Call) -> str | None:
    """Why a ``format``/``format_map`` call is refused: a computed format string (it cannot be read
    here) or a replacement field that walks attributes or items (``{0.real}``, ``{0[k]}``)."""
    template = call.func.value
    if isinstance(template, ast.Name) and template.id == "str":  # str.format(template, ...); str is never rebound
        template = call.args[0] if call.args else None
    if not (isinstance(template, ast.Constant) and isinstance(template.value, str)):
        return f"calls {call.func.attr} on a computed format string"
    if _walks_fields(template.value):
        return f"calls {call.func.attr} with a field that walks attributes or items"
    return None


def _walks_fields(template: str) -> bool:
    """Whether a format string has a replacement field (nested ones too) with ``.`` or ``[`` in its name."""
    try:
        fields = list(string.Formatter().parse(template))
        return any(
            (name and ("." in name or "[" in name)) or (spec and _walks_fields(spec)) for _, name, spec, _ in fields
        )
    except (ValueError, RecursionError):
        return True  # malformed: it would fail in f anyway


def check_execution(task: Task, domain: AZR) -> Validity:
    """Runs f the way the grader runs a solver's f (``AZR.execute``: the sandbox, each call in a
    process of its own, the grader's hash seed) on every input, then on every input under another
    hash seed, then exactly as the grader will: the hidden inputs alone, under the grader's seed, in
    half the grader's time (``VALIDITY_TIME_SHARE``).

    Valid when every run finishes, every output is plain data, the runs agree (so an output cannot
    depend on the hash seed, nor on anything that differs between validity and grading: how many
    inputs the driver loaded, what the heap looks like), and the outputs are not all equal. The
    first run's outputs are recorded in ``task.payload["outputs"]`` for the solver and grader.
    """
    inputs = task.payload["inputs"]
    runs = []
    for hash_seed in (GRADER_HASH_SEED, GRADER_HASH_SEED + 1):
        run = domain.execute(task.payload["code"], inputs, hash_seed=hash_seed)
        if not run.ok:
            return Validity.reject(f"{run.status}: {run.detail}")
        outputs, problem = _outputs(run.result, len(inputs))
        if problem:
            return Validity.reject(problem)
        runs.append(outputs)
    if not all(_same(a, b) for a, b in zip(*runs, strict=True)):
        return Validity.reject("nondeterministic: f gives other outputs under another hash seed")
    hidden = domain.hidden_part(inputs)
    # as graded, in a share of the grader's time: a task that only just finishes cannot time out in grading
    graded = domain.execute(
        task.payload["code"], hidden, time_limit=domain.sandbox_options["time_limit"] * VALIDITY_TIME_SHARE
    )
    outputs, problem = _outputs(graded.result, len(hidden)) if graded.ok else ([], graded.status)
    if problem or not all(_same(a, b) for a, b in zip(outputs, domain.hidden_part(runs[0]), strict=True)):
        return Validity.reject("nondeterministic: f on its hidden inputs alone, as graded, gives other outputs")
    if all(_same(output, runs[0][0]) for output in runs[0]):
        return Validity.reject("trivial: every input gives the same output")
    task.payload["outputs"] = runs[0]
    return Validity.ok()
