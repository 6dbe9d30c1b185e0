"""Canned hostile generations through the real ``propel`` command: an OpenAI-compatible server on
loopback answers the generator and the solver with texts a model could write to break a record
(a lone surrogate, nesting deeper than any parser's limit, non-finite numbers, huge integers, bytes
that are not UTF-8). ``generate``, ``label`` and ``export`` complete, every record reads back, each
unstorable task is rejected with its reason, and a rerun reads everything and redoes nothing."""

import json

import pytest

from propel_core.execution import job_seed, task_id
from propel_core.records import Label, Task, iter_jsonl
from propel_core.testing import LoopbackServer

SEED = 7
INPUTS = "\n".join(json.dumps([i]) for i in range(1, 10))


def azr(code: str, first_input: str) -> str:
    """What follows the prefill ``<code>\\ndef f(``: the rest of f, ten inputs, a hint."""
    return f"{code}\n</code>\n<inputs>\n{first_input}\n{INPUTS}\n</inputs>\n<message>a hint</message>"


def nested(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


GENERATIONS = {
    "lone surrogate in an input": azr("x):\n    return str(type(x))", '["\\ud800"]'),
    "lone surrogate in the generation itself": azr("x):\n    return str(x) + '\ud800'", "[0]"),
    "nested 220 deep": azr("x):\n    return str(x)[:3]", f"[{nested(219)}]"),
    "nested 300 deep": azr("x):\n    return str(x)[:3]", f"[{nested(299)}]"),
    "NaN": azr("x):\n    return x == x", "[NaN]"),
    "Infinity": azr("x):\n    return x > 1", "[Infinity]"),
    "a 2,000-digit integer": azr("x):\n    return x % 7", f"[{'9' * 2000}]"),
    "a 5,000-digit integer": azr("x):\n    return x % 7", f"[{'9' * 5000}]"),
    "plain": azr("x):\n    return x * 2", "[0]"),
}
REJECTED = {
    "nested 220 deep": "nested deeper than 64 levels",
    "nested 300 deep": "nested deeper than 64 levels",
    "NaN": "a non-finite number",
    "Infinity": "a non-finite number",
    "a 2,000-digit integer": "an integer of more than 1000 digits",
    "a 5,000-digit integer": "an input line is not JSON",
}
#: the solver's attempts at a valid task: the right f, then one with an undecodable name in a comment
ATTEMPTS = ["```python\ndef f(x):\n    return x * 2\n```", "```python\ndef f(x):  # \udcff\n    return x * 2\n```"]


class Canned:
    """A model that answers each request by its prompt and seed: the generator's seeds map to
    ``GENERATIONS``, a solver's attempt ``j`` at any task to ``ATTEMPTS[j]``."""

    def __init__(self):
        names = list(GENERATIONS)
        self.generations = {job_seed(SEED, task_id(i)): GENERATIONS[name] for i, name in enumerate(names)}
        self.attempts = {job_seed(SEED, task_id(i), j): ATTEMPTS[j] for i in range(len(names)) for j in range(2)}

    def generate(self, prompts, sampling, n=1, seed=None):
        solver = "hidden Python function" in json.dumps(prompts)
        return [[(self.attempts if solver else self.generations)[seed]] * n]


@pytest.fixture
def served():
    server = LoopbackServer(Canned())
    yield server
    server.close()


def test_hostile_generations_cost_their_own_record_and_nothing_else(served, tmp_path, propel_cli):
    model = {"backend": "openai", "model": "smol", "base_url": served.url, "server_extensions": True}
    config = {
        "run_dir": str(tmp_path / "run"),
        "seed": SEED,
        "domain": {"name": "azr"},
        "generate": {"num_tasks": len(GENERATIONS)},
        "label": {"k": 2, "band_low": 0.5, "band_high": 0.5},
        "executor": {"workers": 3},
        "generator": model,
        "solver": model,
    }
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(config))
    propel_cli("-q", "generate", str(path))
    tasks = {task.id: task for task in iter_jsonl(tmp_path / "run" / "tasks.jsonl", Task)}
    by_name = {name: tasks[task_id(i)] for i, name in enumerate(GENERATIONS)}
    for name, reason in REJECTED.items():
        task = by_name[name]
        assert not task.validity.valid and reason in task.validity.reason, (name, task.validity.reason)
    surrogate = by_name["lone surrogate in an input"]
    assert surrogate.validity.valid, surrogate.validity.reason
    assert surrogate.payload["inputs"][0] == ["\ud800"]  # stored as checked, not as "?" or null
    itself = by_name["lone surrogate in the generation itself"]
    assert itself.generation.endswith(GENERATIONS["lone surrogate in the generation itself"])
    assert by_name["plain"].validity.valid

    propel_cli("-q", "label", str(path))
    labels = {label.task_id: label for label in iter_jsonl(tmp_path / "run" / "labels.jsonl", Label)}
    plain = labels[by_name["plain"].id]
    assert [attempt.solved for attempt in plain.attempts] == [True, False]  # undecodable code: not solved
    assert plain.attempts[1].text == ATTEMPTS[1]

    before = (tmp_path / "run" / "tasks.jsonl").read_bytes(), (tmp_path / "run" / "labels.jsonl").read_bytes()
    requests = len(served.requests)
    propel_cli("-q", "generate", str(path))
    propel_cli("-q", "label", str(path))
    assert len(served.requests) == requests  # nothing redone: every record was read back
    assert ((tmp_path / "run" / "tasks.jsonl").read_bytes(), (tmp_path / "run" / "labels.jsonl").read_bytes()) == before
    exported = propel_cli("export", str(tmp_path / "run"), "--to", str(tmp_path / "dataset"))
    assert "corpus" in exported.stdout
