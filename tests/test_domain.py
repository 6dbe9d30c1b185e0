"""Nothing a model writes may end a stage: a parser, renderer, predicate or grader that fails
unexpectedly rejects that one task (or makes that attempt ungradable) with the error as its reason,
while a component that cannot work here at all still stops the run."""

import pytest
from test_hooks import Tiny

from propel_core.domain import grade_attempt, make_task
from propel_core.errors import Unavailable
from propel_core.records import Task, Validity


class Fragile(Tiny):
    def render(self, payload):
        if payload["text"] == "render":
            raise KeyError("text")
        return payload["text"]

    def grade(self, payload, attempt):
        if attempt == "unavailable":
            raise Unavailable("the sandbox needs bubblewrap")
        if attempt == "crash":
            raise OSError(39, "Directory not empty")
        return super().grade(payload, attempt)


def predicate(task, domain):
    if task.payload["text"] == "ab":
        raise OSError(39, "Directory not empty")
    return Validity.ok()


@pytest.mark.parametrize(
    ("generation", "reason"),
    [("ab", "even_length failed: OSError: [Errno 39] Directory not empty"), ("render", "render failed: KeyError")],
)
def test_an_unexpected_failure_rejects_the_task(generation, reason):
    domain = Fragile()
    task = make_task("a", domain, domain.contexts()[0], generation, "m", {"even_length": predicate})
    assert not task.validity.valid and task.validity.reason.startswith(reason)
    assert make_task("b", domain, domain.contexts()[0], "abcd", "m", {"even_length": predicate}).validity.valid


def test_an_unexpected_grader_failure_makes_the_attempt_ungradable():
    task = Task(
        id="a",
        domain="tiny",
        context_id="c0",
        generation="x",
        payload={"text": "x"},
        validity=Validity.ok(),
        generator="m",
    )
    attempt = grade_attempt(Fragile(), task, "crash")
    assert attempt.solved is None and attempt.reason.startswith("grader failed: OSError")
    assert grade_attempt(Fragile(), task, "x").solved is True
    with pytest.raises(Unavailable, match="bubblewrap"):
        grade_attempt(Fragile(), task, "unavailable")
