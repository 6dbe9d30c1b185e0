"""The AZR domain: registration, seeds, parsing, static filter, grading and topics."""

import functools
import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from propel_azr.plugin import GRADER_HASH_SEED, check_static
from propel_azr.topics import topic_of
from propel_core.domain import ParseError, make_task
from propel_core.plugins import Registry
from propel_core.records import Context, Task, Validity
from propel_core.testing import assert_same_verdicts_concurrently


def test_shows_up_in_propel_plugins(propel_registry):
    described = {p["name"]: p for p in propel_registry.describe()}
    assert described["azr"]["registers"] == {"domains": ["azr"], "validity_predicates": ["azr_execution", "azr_static"]}


@pytest.fixture(scope="module")
def domain():
    registry = Registry.build()
    if registry.get("sandboxes", "local")().missing_layers():
        pytest.skip("needs bubblewrap and root")
    return registry.domain("azr")


@pytest.fixture(scope="module")
def predicates():
    registry = Registry.build()
    return {name: registry.get("validity_predicates", name) for name in ("azr_static", "azr_execution")}


def generation(code: str, inputs: list, message: str = "a hint") -> str:
    lines = "\n".join(json.dumps(args) for args in inputs)
    return f"<code>\n{code}\n</code>\n<inputs>\n{lines}\n</inputs>\n<message>{message}</message>"


def test_every_seed_passes_both_predicates(predicates):
    seeds_domain = Registry.build().domain("azr", min_inputs=3, shown=1, hidden=2)
    contexts = seeds_domain.contexts()
    assert len(contexts) >= 60
    for context in contexts:
        text = generation(context.data["code"], context.data["inputs"])
        task = make_task("s", seeds_domain, context, text, "m", predicates)
        assert task.validity.valid, (context.id, task.validity.reason)
        assert len(task.payload["outputs"]) == 3


def test_parse_render_round_trip(domain):
    text = "Sure.\n" + generation("def f(x):\n    return x * 2", [[i] for i in range(12)]) + "\nDone."
    payload = domain.parse(text)
    assert payload["code"] == "def f(x):\n    return x * 2"
    assert payload["inputs"] == [[i] for i in range(10)]  # shown + hidden
    assert domain.parse(domain.render(payload)) == payload


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("no tags at all", "no <code> section"),
        (generation("def f(x): return x", [[1]] * 12), "1 distinct inputs, need at least 10"),
        (generation("def f(x): return x", [[i] for i in range(10)]).replace("[9]", "[9, oops"), "not JSON"),
        (generation("def f(x): return x", [[i] for i in range(9)] + [5]), "an input line is not a JSON list"),
        (generation("def f(x): return x", [[i] for i in range(10)], ""), "the message must be 1-500 characters"),
        # a grader reading the solver's code block would stop at these backticks: its own f could not pass
        (generation("def f(x):\n    return '```' + str(x)", [[i] for i in range(10)]), "holds a Markdown fence"),
    ],
)
def test_parse_rejections(domain, text, reason):
    with pytest.raises(ParseError, match=reason):
        domain.parse(text)


def static(code: str) -> Validity:
    task = Task(
        id="t",
        domain="azr",
        context_id="c",
        generation="",
        generator="m",
        validity=Validity.ok(),
        payload={"code": code, "inputs": [], "message": "m"},
    )
    return check_static(task, None)


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("def f(x):\n    return x", None),
        ("import math\nfrom collections import Counter\ndef f(x):\n    return math.floor(x)", None),
        ("def f(x): return x\ndef g(x): return x", "must define exactly one top-level function, f"),
        ("def g(x): return x", "must define exactly one top-level function, f"),
        ("x = 3\ndef f(y): return y", "top-level Assign statement outside f"),
        ("import os\ndef f(x): return x", "imports a module outside the allowed set: os"),
        ("from importlib import import_module\ndef f(x): return x", "imports a module outside the allowed set"),
        ("def f(x):\n    return eval('x')", "uses the banned name eval"),
        ("def f(x):\n    return x.__class__", "uses the dunder attribute __class__"),
        ("def f(x):\n    return __builtins__", "uses the banned name __builtins__"),
        ("def f(x)\n    return x", "the code does not parse"),
        # identifiers outside names and attributes: a class pattern's keywords, keyword arguments,
        # import aliases, parameters, what except, a pattern or a lambda binds
        (
            "def f(x):\n    match x:\n        case object(__class__=t):\n            return t\n    return 0",
            "uses the dunder",
        ),
        ("def f(x):\n    match x:\n        case str(_a=t):\n            return t\n    return 0", "uses the private"),
        ("def f(x):\n    match x:\n        case int(real=r):\n            return r\n    return 0", None),
        ("def f(x):\n    return dict(__class__=x)", "uses the dunder attribute __class__"),
        ("def f(x):\n    return dict(modules=x)", "uses the banned attribute modules"),
        ("from math import pi as __builtins__\ndef f(x):\n    return x", "uses the banned name __builtins__"),
        ("from math import floor as eval\ndef f(x):\n    return eval(x)", "uses the banned name eval"),
        ("def f(__x):\n    return 1", "uses the banned name __x"),
        ("def f(x):\n    return (lambda __y: __y)(x)", "uses the banned name __y"),
        (
            "def f(x):\n    try:\n        return 1 // x\n    except ZeroDivisionError as __e:\n        return 0",
            "uses the banned name",
        ),
        (
            "def f(x):\n    match x:\n        case {'a': 1, **__rest}:\n            return 1\n    return 0",
            "uses the banned name",
        ),
        (
            "def f(x):\n    match x:\n        case [*__rest]:\n            return 1\n    return 0",
            "uses the banned name",
        ),
        ("def f(xs):\n    return sorted(xs, key=len, reverse=True)", None),
    ],
)
def test_static_filter(code, reason):
    validity = static(code)
    assert validity.valid is (reason is None)
    if reason:
        assert validity.reason.startswith(reason)


@pytest.fixture(scope="module")
def task(domain, predicates):
    inputs = [[[i, 2 * i, i % 3]] for i in range(10)]
    text = generation("def f(xs):\n    return sorted(xs, reverse=True)[:2]", inputs, "the two largest, descending")
    made = make_task("t", domain, Context(id="c", data={}), text, "m", predicates)
    assert made.validity.valid
    return made


@pytest.mark.parametrize(
    ("attempt", "solved", "reason"),
    [
        ("```python\ndef f(xs):\n    return sorted(xs)[::-1][:2]\n```", True, None),
        ("```python\ndef f(xs):\n    return sorted(xs)[-2:]\n```", False, "hidden outputs match"),
        ("```\ndef f(xs):\n    return [max(xs), sorted(xs)[-2]]\n```", True, None),
        ("I think it sorts.", False, "no code block"),
        ("```python\ndef f(xs) return\n```", False, "error: "),
        ("```python\ndef f(xs):\n    return tuple(sorted(xs, reverse=True)[:2])\n```", True, None),
        ("```python\ndef f(xs):\n    return [float(x) for x in sorted(xs, reverse=True)[:2]]\n```", False, "0/5"),
    ],
)
def test_grader_on_hand_checked_attempts(domain, task, attempt, solved, reason):
    verdict = domain.grade(task.payload, attempt)
    assert verdict.solved is solved, verdict
    if reason:
        assert reason in verdict.reason


def test_solver_prompt_shows_five_pairs_and_hint(domain, task):
    text = domain.solver_prompt(task.payload)[0]["content"]
    assert text.count("f([") == 5 and "the two largest, descending" in text
    assert "f([0, 0, 0]) == [0, 0]" in text


@pytest.mark.parametrize(
    ("code", "topic"),
    [
        ("def f(n):\n    return 1 if n < 2 else n * f(n - 1)", "recursion"),
        ("def f(xs):\n    return sorted(xs)", "sorting/order"),
        ("def f(s):\n    return s.upper()", "string manipulation"),
        ("def f(xs):\n    return {x: 1 for x in xs}", "counting/mapping"),
        ("def f(xs):\n    return [x for x in xs if x > 0]", "list filtering"),
        ("def f(s):\n    return s[::-1]", "slicing/reversal"),
        ("def f(n):\n    return n % 7", "number theory"),
        ("def f(a, b):\n    return a * b + 1", "arithmetic"),
        ("def f(xs):\n    return [x for x in xs]", "iteration"),
        ("not python", "other"),
    ],
)
def test_topics(code, topic):
    assert topic_of(code) == topic


@functools.cache
def shared():
    registry = Registry.build()
    return registry.domain("azr"), {"azr_static": registry.get("validity_predicates", "azr_static")}


@settings(max_examples=1500, deadline=None)
@given(
    st.text(max_size=300)
    | st.builds(
        lambda code, inputs, message: generation(code, inputs, message),
        st.text(max_size=120),
        st.lists(st.lists(st.integers() | st.text(max_size=5), max_size=3), max_size=14),
        st.text(max_size=40),
    )
)
def test_parse_and_static_filter_never_raise(text):
    domain, predicates = shared()
    made = make_task("t", domain, Context(id="c", data={}), text, "m", predicates)
    assert made.validity.valid or made.validity.reason


@pytest.mark.slow
def test_generate_on_the_embedded_model(propel_cli, tmp_path, domain):
    config = tmp_path / "azr.yaml"
    config.write_text(
        f"run_dir: {tmp_path}\ndomain:\n  name: azr\ngenerate:\n  num_tasks: 3\n"
        "generator:\n  sampling: {max_new_tokens: 96}\n"
    )
    out = propel_cli("-q", "generate", str(config)).stdout
    assert out.startswith("generated 3 -> parsed")
    from propel_core.records import iter_jsonl

    tasks = list(iter_jsonl(tmp_path / "tasks.jsonl", Task))
    assert len(tasks) == 3 and all(t.generation.startswith("<code>\ndef f(") for t in tasks)
    for task in tasks:
        assert task.validity.valid or task.validity.reason
        if task.validity.valid:
            assert len(task.payload["outputs"]) == 10 and task.topic


def hash_under_grader_seed(text: str) -> int:
    """``hash(text)`` in a process with the grader's hash seed."""
    code = f"print(hash({text!r}))"
    env = {"PYTHONHASHSEED": str(GRADER_HASH_SEED), "PATH": "/usr/bin:/bin"}
    return int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout)


@pytest.mark.parametrize(
    "code",
    [
        # the same under one other hash seed, another under the grader's: its own task would fail it
        "def f(x):\n    return x + int(hash('propel') == {h})",
        # state kept across calls: the grader calls five hidden inputs after none of the shown ones
        "def f(x, seen=[]):\n    seen.append(x)\n    return x * 10 + len(seen)",
        "import math\ndef f(x):\n    math.tau = math.tau + 1\n    return x + int(math.tau)",
        # which inputs came before: the grader's second hidden call comes after the first hidden one
        "def f(x, seen=set()):\n    seen.add(x)\n    return x + (1 if x == 6 and 5 in seen else 0)",
        "def f(x, n=[0]):\n    n[0] += 1\n    return x + (n[0] >= 6)",
        # the heap the driver leaves depends on how many inputs it loaded (10 in validity, 5 graded)
        "def f(x):\n    return [x, id([]) % 16384]",
    ],
)
def test_validity_mirrors_grading(domain, predicates, code):
    """A task is valid only when its own f, graded as a solver's code is (the hidden inputs alone, the
    grader's hash seed), reproduces the outputs recorded for it."""
    code = code.format(h=hash_under_grader_seed("propel"))
    text = generation(code, [[i] for i in range(10)])
    task = make_task("t", domain, Context(id="c", data={}), text, "m", predicates)
    if task.validity.valid:
        assert domain.grade(task.payload, f"```python\n{code}\n```").solved is True, "its own f fails its task"
    else:
        assert task.validity.reason.startswith("azr_execution: nondeterministic"), task.validity.reason


#: outputs that depend on where objects land in memory: under address randomization each run
#: draws another layout, so a bit of an address agrees across the three validity runs one time in
#: four and with grading one time in two
LAYOUT_DEPENDENT = [
    "def f(x):\n    return x + (id(object()) >> 24) % 2",
    "def f(x):\n    return [x, (hash(object()) >> 21) % 2]",
    "def f(x):\n    return [x, int(repr(object())[-7], 16) % 2]",
]


@pytest.mark.parametrize("code", LAYOUT_DEPENDENT)
def test_a_layout_dependent_task_is_always_invalid_or_always_consistent(domain, predicates, code):
    """Runs are reproducible by construction (the sandbox turns address randomization off): the
    same layout-dependent f, checked and graded six times, gets the same validity every time, and
    when valid the same outputs, which its own f then reproduces under grading."""
    text = generation(code, [[i] for i in range(10)])
    outcomes = set()
    for _ in range(6):
        task = make_task("t", domain, Context(id="c", data={}), text, "m", predicates)
        graded = domain.grade(task.payload, f"```python\n{code}\n```").solved if task.validity.valid else None
        outcomes.add((task.validity.reason, json.dumps(task.payload and task.payload.get("outputs")), graded))
    assert len(outcomes) == 1, outcomes
    reason, _, graded = outcomes.pop()
    assert graded is True or reason.startswith("azr_execution: nondeterministic"), (reason, graded)


def test_validity_and_grading_run_the_same_bytes(domain, predicates, monkeypatch):
    """With address randomization off, a program's layout still follows its own text: a task's f is
    run as one canonical text in validity and in grading, whatever the solver's code block adds
    around it (a newline before the fence, blank lines)."""
    code = "def f(x):\n    return x + (id(bytes(2000)) >> 4) % 2\n#" + "p" * 705
    seen = []
    run_python = domain.sandbox.run_python

    def recording(files, main, **options):
        seen.append(files["candidate.py"])
        return run_python(files, main, **options)

    monkeypatch.setattr(domain.sandbox, "run_python", recording)
    task = make_task("t", domain, Context(id="c", data={}), generation(code, [[i] for i in range(10)]), "m", predicates)
    for block in (f"```python\n{code}\n```", f"```python\n\n{code}\n\n\n```"):
        verdict = domain.grade(task.payload, block)
        assert not task.validity.valid or verdict.solved is True, (task.validity, verdict)
    assert len(seen) == 5 and len(set(seen)) == 1


def test_each_call_starts_afresh(domain):
    """Each call runs in a process of its own, and the inputs file is gone before f runs: a call sees
    neither the calls before it nor the inputs to come."""
    counts = domain.execute("def f(x, seen=[]):\n    seen.append(x)\n    return len(seen)", [[1], [2], [3]])
    assert [output["value"] for output in counts.result["outputs"]] == [1, 1, 1]
    peek = "import os\ndef f(x):\n    return sorted(os.listdir('.'))"
    assert "inputs.json" not in domain.execute(peek, [[0]]).result["outputs"][0]["value"]


def test_verdicts_are_the_same_graded_in_many_threads(domain, task):
    attempts = [
        "```python\ndef f(xs):\n    return sorted(xs)[::-1][:2]\n```",
        "```python\ndef f(xs):\n    return sorted(xs)[-2:]\n```",
        "```python\ndef f(xs):\n    while True:\n        pass\n```",
        "```python\ndef f(xs):\n    return [1e999]\n```",
        "no code",
        "```python\nimport os\ndef f(xs):\n    os._exit(0)\n```",
    ]
    assert_same_verdicts_concurrently(domain, [(task.payload, attempt) for attempt in attempts], threads=6)
