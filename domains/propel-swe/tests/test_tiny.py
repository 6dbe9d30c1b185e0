"""The swe domain end to end on the tiny repository, in the real local sandbox: preflight, the
verifier's verdicts, scripted agents (bug writer and solver) and the procedural generator."""

import json
import time

import pytest
from swe_helpers import BUG, fenced, scripted

from propel_core.domain import make_task
from propel_core.plugins import Registry
from propel_core.records import Context

NO_OP_BUG = BUG.replace("+    if value > low:", "+    if high < value:")
TEST_EDIT = """\
--- a/tests/test_core.py
+++ b/tests/test_core.py
@@ -6,2 +6,2 @@
 def test_mean():
-    assert mean([1, 2, 3, 4]) == 2.5
+    assert mean([1, 2, 3, 4]) == 3
\x20
"""
SYNTAX_ERROR = BUG.replace("+    if value > low:", "+    if value >>= high:")
STALE = BUG.replace("     if value < low:", "     if value <= low:")


def test_preflight(tiny_domain):
    baseline = tiny_domain.baseline(tiny_domain.repos["tinystats"])
    assert baseline.status == "ok" and baseline.keep
    assert baseline.test_count == 7 and baseline.failures == 0
    assert baseline.tests["tests/test_core.py::test_clamp"] == "passed"
    assert baseline.imported_files == ["tinystats/__init__.py", "tinystats/core.py"]
    assert [c.id for c in tiny_domain.contexts()] == ["tinystats"]


def verify(domain, diff):
    payload = {"repo": "tinystats", "diff": diff, "turns": ["x"]}
    return domain.verify(payload), payload


def test_a_real_bug_is_valid_and_its_failing_tests_recorded(tiny_domain):
    validity, payload = verify(tiny_domain, BUG)
    assert validity.valid, validity.reason
    assert payload["failing_tests"] == ["tests/test_core.py::test_clamp"]
    assert payload["verification"]["outcomes"] == {"passed": 6, "failed": 1}


@pytest.mark.parametrize(
    ("diff", "reason"),
    [
        (TEST_EDIT, "touches tests"),
        (BUG.replace("tinystats/core.py", "../core.py"), "does not apply"),
        (STALE, "does not apply"),
        (NO_OP_BUG, "no previously passing test fails"),
        (SYNTAX_ERROR, "does not parse"),
    ],
)
def test_the_verifier_refuses(tiny_domain, diff, reason):
    validity, _ = verify(tiny_domain, diff)
    assert not validity.valid and reason in validity.reason


@pytest.mark.parametrize("failing", [1, 2])
def test_a_checkout_that_cannot_be_sealed_refuses_the_bug_in_one_line(tiny_domain, monkeypatch, failing):
    """Clearing a checkout before the bug's code runs in it (``seal``) fails only when the sandbox
    does: the bug is then refused with the reason, whether it failed before the whole suite (call 1)
    or before a failing test runs again alone (call 2); nothing raises out of the verifier."""
    from propel_core.errors import PropelError
    from propel_swe import verifier

    calls, seal = [], verifier.seal

    def failing_at(ws):
        calls.append(ws)
        if len(calls) == failing:
            raise PropelError("could not clear the checkout for the change: no space left on device")
        seal(ws)

    monkeypatch.setattr(verifier, "seal", failing_at)
    validity, _ = verify(tiny_domain, BUG)
    assert not validity.valid and "no space left on device" in validity.reason, validity.reason
    assert len(calls) == failing


def test_a_solver_that_reverts_the_bug_solves_it(tiny_domain):
    payload = {"repo": "tinystats", "diff": BUG, "turns": [], "failing_tests": ["tests/test_core.py::test_clamp"]}
    reply = scripted(
        fenced("bash", "git log --oneline; git status --short"),
        fenced("show", "tinystats/core.py 16 21"),
        fenced(
            "edit",
            "tinystats/core.py\n<<<<<<< SEARCH\n    if value > low:\n=======\n    if value > high:\n>>>>>>> REPLACE",
        ),
        fenced("submit"),
    )
    attempt = tiny_domain.solver_episode(payload, reply)
    record = json.loads(attempt)
    assert record["stop_reason"] == "stop" and record["status"] == "finished"
    history = reply.seen[1][-1]["content"]
    assert "repository" in history and "clamp" not in history  # the bug is not in the git history
    assert "18      if value > low:" in reply.seen[2][-1]["content"]
    verdict = tiny_domain.grade(payload, attempt)
    assert verdict.solved is True, verdict.reason


def test_verdicts_are_the_same_idle_and_at_4x_oversubscription(tiny_domain, monkeypatch):
    """A real bug, a no-op bug, the bug's revert, an attempt that does nothing, a fix that loops for
    ever and one that sleeps, judged idle and beside eight CPU hogs on two cores (in a session of their
    own): the same verdicts, as the sandbox judges every run by its CPU and own time (docs/sandbox.md,
    "Time"). The least limits are lowered (a test's to 1 s, the suite's to 8 s) to keep it short."""
    from propel_core.testing import assert_same_verdicts_under_load
    from propel_swe import verifier

    monkeypatch.setattr(verifier, "MIN_TEST_SECONDS", 1.0)
    monkeypatch.setattr(verifier, "MIN_SUITE_SECONDS", 8.0)

    payload = {"repo": "tinystats", "diff": BUG, "turns": [], "failing_tests": ["tests/test_core.py::test_clamp"]}
    revert = fenced(
        "edit", "tinystats/core.py\n<<<<<<< SEARCH\n    if value > low:\n=======\n    if value > high:\n>>>>>>> REPLACE"
    )
    stalled = {
        "loops": "    while True:\n        pass\n",
        "sleeps": "    import time\n\n    time.sleep(10**6)\n",
    }
    attempts = {
        "the revert": tiny_domain.solver_episode(payload, scripted(revert, fenced("submit"))),
        "nothing": tiny_domain.solver_episode(payload, scripted(fenced("submit"))),
    }
    for name, body in stalled.items():
        edit = f"tinystats/core.py\n<<<<<<< SEARCH\n    if value > low:\n=======\n{body}    if value > high:\n>>>>>>> REPLACE"
        attempts[f"the revert, then it {name}"] = tiny_domain.solver_episode(
            payload, scripted(fenced("edit", edit), fenced("submit"))
        )

    def judge(case):
        kind, text = case
        if kind == "bug":
            validity, _ = verify(tiny_domain, text)
            return validity.valid, validity.reason
        verdict = tiny_domain.grade(payload, text)
        return verdict.solved, verdict.reason

    cases = {"a real bug": ("bug", BUG), "a no-op bug": ("bug", NO_OP_BUG)}
    cases |= {f"a fix: {name}": ("fix", text) for name, text in attempts.items()}
    found = assert_same_verdicts_under_load(judge, cases, per_core=4)
    assert [found[name][0] for name in cases] == [True, False, True, False, False, False], found


def test_a_solver_that_does_nothing_fails(tiny_domain):
    payload = {"repo": "tinystats", "diff": BUG, "turns": [], "failing_tests": []}
    verdict = tiny_domain.grade(payload, tiny_domain.solver_episode(payload, scripted(fenced("submit"))))
    assert verdict.solved is False and verdict.reason == "the attempt changed nothing"


def test_a_fix_that_edits_the_tests_is_not_a_solution(tiny_domain):
    payload = {"repo": "tinystats", "diff": BUG, "turns": [], "failing_tests": []}
    cheat = fenced("bash", "sed -i 's/== \\[0, 5, 10\\]/!= None/' tests/test_core.py")
    verdict = tiny_domain.grade(payload, tiny_domain.solver_episode(payload, scripted(cheat, fenced("submit"))))
    assert verdict.solved is False and "touches tests" in verdict.reason


def test_a_solver_out_of_time_is_graded_on_its_edit(tiny_domain, monkeypatch):
    """Running out the budget is the solver's doing: not solved (never ungradable, which solve-train
    pays the group's mean reward and labels leave out of the solve rate)."""
    monkeypatch.setattr(tiny_domain, "solver_budget", 2.0)
    payload = {"repo": "tinystats", "diff": BUG, "turns": [], "failing_tests": []}
    started = time.monotonic()
    attempt = tiny_domain.solver_episode(payload, scripted(fenced("bash", "sleep 30"), fenced("submit")))
    assert time.monotonic() - started < 20
    assert json.loads(attempt)["stop_reason"] == "timeout"
    verdict = tiny_domain.grade(payload, attempt)
    assert verdict.solved is False and verdict.reason == "the attempt changed nothing"


def test_scripted_bug_writer_end_to_end(tiny_domain):
    registry = Registry.build()
    predicates = {"swe_bug": registry.get("validity_predicates", "swe_bug")}
    context = Context(id="tinystats", data={"repo": "tinystats"})
    reply = scripted(
        "Let me look around first.",
        fenced("bash", "grep -n 'value > high' tinystats/core.py"),
        fenced(
            "bash",
            "sed -i 's/value > high/value > low/' tinystats/core.py && python -m pytest -q -p no:cacheprovider 2>&1 | tail -1",
        ),
        fenced("submit"),
    )
    generation = tiny_domain.episode(context, reply, seed=0)
    trajectory = json.loads(generation)
    assert trajectory["stop_reason"] == "stop"
    assert [turn["tool"] for turn in trajectory["turns"]] == [None, "bash", "bash", "submit"]
    assert trajectory["turns"][0]["output"].startswith("No tool call found")
    assert trajectory["turns"][1]["output"] == "exit code 0\n18:    if value > high:\n"
    assert "1 failed, 6 passed" in trajectory["turns"][2]["output"]
    assert len(trajectory["messages"]) == 2 + 4 + 3  # system, user, 4 assistant turns, 3 tool results
    task = make_task("t0", tiny_domain, context, generation, "scripted", predicates)
    assert task.validity.valid, task.validity.reason
    assert task.text == [turn["assistant"] for turn in trajectory["turns"]]
    assert task.topic == "tinystats:tinystats/core.py"
    assert task.payload["failing_tests"] == ["tests/test_core.py::test_clamp"]


def test_stop_reasons(tiny_domain):
    context = Context(id="tinystats", data={"repo": "tinystats"})
    talk = json.loads(tiny_domain.episode(context, scripted(*["I am thinking."] * 6), seed=0))
    assert talk["stop_reason"] == "max_turns" and len(talk["turns"]) == 6
    cut = json.loads(tiny_domain.episode(context, scripted("```bash\nsed -i 's/a/b/' tinystats/co"), seed=0))
    assert cut["stop_reason"] == "length" and cut["diff"] == ""


def test_procedural_bugs_pass_the_verifier(tiny_domain, monkeypatch):
    monkeypatch.setattr(tiny_domain, "generator", "procedural")
    context = Context(id="tinystats", data={"repo": "tinystats"})
    validities = []
    for seed in range(6):
        payload = tiny_domain.parse(tiny_domain.episode(context, None, seed=seed))
        assert payload["generator"] == "procedural" and payload["diff"].startswith("--- a/tinystats/")
        validities.append(tiny_domain.verify(payload))
    assert any(v.valid for v in validities), [v.reason for v in validities]


@pytest.mark.parametrize(
    "calls",
    [
        [fenced("show", '"tinystats/core.py')],  # a quote left open
        [fenced("show", "tinystats/core.py \u00b2")],  # a digit int() cannot read
        [  # an edit of a file that is not UTF-8
            fenced("bash", "printf '\\377\\376 x\\n' > tinystats/blob.py"),
            fenced("edit", "tinystats/blob.py\n<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE"),
        ],
    ],
    ids=["unclosed-quote", "superscript-digit", "edit-not-utf8"],
)
def test_a_tool_call_that_makes_a_tool_raise_is_the_models_error(tiny_domain, calls):
    """What a call's text makes a tool raise is shown to the model as an error; the episode goes on,
    and the attempt is graded, never left ungradable by the model's own text."""
    payload = {"repo": "tinystats", "diff": BUG, "turns": [], "failing_tests": []}
    attempt = tiny_domain.solver_episode(payload, scripted(*calls, fenced("submit")))
    record = json.loads(attempt)
    assert record["status"] == "finished", record
    assert record["turns"][len(calls) - 1]["output"].startswith("error: "), record["turns"]
    assert tiny_domain.grade(payload, attempt).solved is False
