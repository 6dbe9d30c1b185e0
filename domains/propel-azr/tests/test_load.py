"""AZR's verdicts on a busy machine: the same attempts and tasks, near their time limit, endlessly
looping and sleeping, graded idle and beside sixteen CPU hogs on two cores, get the same verdicts."""

import pytest

from propel_core.records import Task, Validity
from propel_core.testing import assert_same_verdicts_under_load

TIME_LIMIT = 1.0
BURN = "import time\ndef burn(s):\n    t = time.process_time()\n    while time.process_time() - t < s: pass\n"
#: solver answers at f(xs) = max(xs) - min(xs) over ten inputs, each f called in a process of its own
ANSWERS = {
    "right": "def f(xs):\n    return max(xs) - min(xs) if xs else 0\n",
    "right, computing near its limit": BURN + "def f(xs):\n    burn(0.06)\n    return max(xs) - min(xs) if xs else 0\n",
    "wrong": "def f(xs):\n    return max(xs)\n",
    "an endless loop": "def f(xs):\n    while True:\n        pass\n",
    "a sleeper": "import time\ndef f(xs):\n    time.sleep(10 ** 6)\n",
}


@pytest.fixture(scope="module")
def domain():
    from propel_core.plugins import Registry

    registry = Registry.build()
    if registry.get("sandboxes", "local")().missing_layers():
        pytest.skip("needs bubblewrap and root (run scripts/setup.sh as root)")
    # the backstop raised so that the test's own load (another test worker beside it) cannot reach it
    return registry.domain("azr", sandbox_options={"time_limit": TIME_LIMIT, "memory_mb": 256, "backstop": 60})


def task(code: str) -> Task:
    payload = {"code": code, "inputs": [[[i, i * i % 7, 3]] for i in range(10)], "message": "hint"}
    return Task(
        id="a", domain="azr", context_id="c", generation="", payload=payload, validity=Validity.ok(), generator="m"
    )


def test_answers_and_tasks_get_the_same_verdicts_idle_and_at_8x_oversubscription(domain):
    from propel_azr.plugin import check_execution

    reference = task(ANSWERS["right"])
    assert check_execution(reference, domain).valid  # which records its outputs in the payload

    def grade(case):
        kind, code = case
        if kind == "task":  # the generator's function through the execution predicate (validity)
            validity = check_execution(task(code), domain)
            return validity.valid, (validity.reason or "").split(":")[0]
        verdict = domain.grade(reference.payload, f"```python\n{code}```")
        return verdict.solved, verdict.diagnostics.get("sandbox_status")

    cases = {f"answer {name}": ("answer", code) for name, code in ANSWERS.items()}
    cases |= {f"task {name}": ("task", code) for name, code in ANSWERS.items() if name != "wrong"}
    verdicts = assert_same_verdicts_under_load(grade, cases)
    assert [verdicts[f"answer {name}"][0] for name in ANSWERS] == [True, True, False, False, False]
    assert [verdicts[f"task {name}"][0] for name in ANSWERS if name != "wrong"] == [True, True, False, False]
