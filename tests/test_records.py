"""Records and crash-safe JSONL files."""

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from propel_core.domain import Domain, Verdict, grade_attempt, make_task
from propel_core.records import (
    MAX_DEPTH,
    Context,
    JsonlWriter,
    Label,
    SolverAttempt,
    Task,
    Validity,
    check_value,
    decode,
    encode,
    iter_jsonl,
    replace_whole,
)


def a_task(i: int) -> Task:
    return Task(id=f"t{i}", domain="d", context_id="c", generation="g", validity=Validity.ok(), generator="m")


def test_round_trip(tmp_path):
    path = tmp_path / "tasks.jsonl"
    with JsonlWriter(path) as out:
        for i in range(3):
            out.write(a_task(i))
    assert [t.id for t in list(iter_jsonl(path, Task))] == ["t0", "t1", "t2"]
    assert path.read_text().count("\n") == 3


def test_torn_tail_is_skipped_then_cut(tmp_path):
    path = tmp_path / "tasks.jsonl"
    with JsonlWriter(path) as out:
        out.write(a_task(0))
    with path.open("a") as f:
        f.write('{"id": "t1", "dom')  # a crash mid-line
    assert [t.id for t in list(iter_jsonl(path, Task))] == ["t0"]
    with JsonlWriter(path) as out:
        out.write(a_task(2))
    assert [t.id for t in list(iter_jsonl(path, Task))] == ["t0", "t2"]


def attempts(*solved):
    return [SolverAttempt(text="", solved=s) for s in solved]


def test_label_in_band():
    label = Label.from_attempts("t", attempts(True, False, False, False, False, False, False, False), (1 / 8, 3 / 8), 2)
    assert (label.solve_rate, label.utility, label.valid_attempts) == (1 / 8, 1, 8)


def test_label_band_edges():
    band = (1 / 8, 3 / 8)
    assert Label.from_attempts("t", attempts(*[True] * 3 + [False] * 5), band, 1).utility == 1
    assert Label.from_attempts("t", attempts(*[True] * 4 + [False] * 4), band, 1).utility == 0
    assert Label.from_attempts("t", attempts(*[False] * 8), band, 1).utility == 0


def test_label_null_attempts_and_minimum():
    label = Label.from_attempts("t", attempts(True, None, False), (1 / 3, 2 / 3), 2)
    assert (label.valid_attempts, label.solve_rate, label.utility) == (2, 0.5, 1)
    short = Label.from_attempts("t", attempts(True, None, None), (1 / 3, 2 / 3), 2)
    assert (short.solve_rate, short.utility) == (1.0, None)
    assert Label.from_attempts("t", attempts(None, None), (0, 1), 1).solve_rate is None


# -- the codec: whatever a model wrote round-trips exactly, or is refused with a reason ------------


# any code point, lone surrogates included (what a "\ud800" escape or os.fsdecode of bytes gives)
hostile_text = st.text(st.characters(exclude_categories=()), max_size=12)
# surrogates side by side: a high then a low one as two code points has no exact JSON form
surrogate_text = st.lists(st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff", "a"]), max_size=5).map("".join)
hostile_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**1200), max_value=10**1200)
    | st.floats()
    | hostile_text
    | surrogate_text,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner)
        | st.dictionaries(hostile_text, inner, max_size=3)
        | st.dictionaries(st.integers(), inner, min_size=1, max_size=2)
        | st.sets(st.integers(), max_size=2)
    ),
    max_leaves=12,
)


class Replays(Domain):
    """A domain whose generations are the payloads themselves and whose grader returns them."""

    name = "replays"

    def __init__(self, payload=None, diagnostics=None):
        self.payload, self.diagnostics = payload, diagnostics

    def contexts(self):
        return [Context(id="c", data={})]

    def generator_prompt(self, context):
        return []

    def parse(self, generation):
        return self.payload

    def render(self, payload):
        return "task"

    def solver_prompt(self, payload):
        return []

    def grade(self, payload, attempt):
        return Verdict(True, attempt, self.diagnostics)


def round_trip(tmp_path, record):
    """The record read back from a JSONL file written by the stages' writer (and by ``encode``)."""
    path = tmp_path / "records.jsonl"
    path.unlink(missing_ok=True)
    with JsonlWriter(path, fsync=False) as out:
        assert out.write(record)
    (back,) = iter_jsonl(path, type(record))
    assert decode(encode(record), type(record)) == back
    return back


def same(a, b) -> bool:
    """Equal, and of the same JSON types all the way down (True is not 1)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True) and a == b


@settings(max_examples=300, deadline=None)
@given(value=hostile_values, text=hostile_text)
def test_a_task_is_stored_as_checked_or_rejected_with_a_reason(tmp_path_factory, value, text):
    tmp_path = tmp_path_factory.mktemp("codec")
    payload = {"v": value, "s": text}
    task = make_task("t0", Replays(payload), Context(id="c", data={}), text, text, {})
    problem = check_value(payload, "payload")
    back = round_trip(tmp_path, task)
    if problem is None:
        assert task.validity.valid and same(back.payload, payload) and back.generation == text
    else:
        assert not task.validity.valid and problem in task.validity.reason
        assert back.payload is None and back.validity.reason == task.validity.reason
    assert back == task


@settings(max_examples=300, deadline=None)
@given(value=hostile_values, text=hostile_text)
def test_a_graded_attempt_is_stored_as_graded(tmp_path_factory, value, text):
    """The verdict stands whatever its diagnostics hold; a value no record can hold becomes None, with
    the reason under ``unrecordable`` (an overflowing metric must not cost the attempt or the log)."""
    tmp_path = tmp_path_factory.mktemp("codec")
    diagnostics = {"v": value, "markers": ["ran"]}
    task = Task(id="t", domain="replays", context_id="c", generation="", validity=Validity.ok(), generator=text)
    attempt = grade_attempt(Replays(diagnostics=diagnostics), task, text)
    assert attempt.solved is True and check_value(attempt.reason) is None
    assert attempt.reason == text or check_value(text) is not None  # a pair held as two code points is merged
    if check_value(diagnostics) is None:
        assert same(attempt.diagnostics, diagnostics)
    else:
        assert attempt.diagnostics["v"] is None and attempt.diagnostics["markers"] == ["ran"]
        assert attempt.diagnostics["unrecordable"]["v"] == check_value(value, "diagnostics.v")
    label = Label.from_attempts("t", [attempt, attempt], (0.0, 1.0), 1)
    assert round_trip(tmp_path, label) == label
    assert round_trip(tmp_path, Context(id=text, data={"x": text}, bucket=text)).id == text


@pytest.mark.parametrize("depth", [MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 220, 300, 5000])
def test_deep_nesting_is_stored_or_rejected_at_parse_time(tmp_path, depth):
    value = 1
    for _ in range(depth):
        value = [value]
    task = make_task("t0", Replays({"v": value}), Context(id="c", data={}), "", "m", {})
    assert task.validity.valid == (depth < MAX_DEPTH), task.validity.reason
    if not task.validity.valid:
        assert task.validity.reason.startswith("parse: the task cannot be recorded exactly: nested deeper than")
    assert round_trip(tmp_path, task) == task


def test_a_record_the_codec_cannot_write_costs_that_record_alone(tmp_path, caplog):
    path = tmp_path / "labels.jsonl"
    with JsonlWriter(path) as out:
        assert out.write(SolverAttempt(text="a", solved=True))
        assert not out.write(SolverAttempt(text="b", solved=True, diagnostics={"x": float("nan")}))
        assert out.write(SolverAttempt(text="\udcff", solved=False))
    assert [attempt.text for attempt in iter_jsonl(path, SolverAttempt)] == ["a", "\udcff"]
    assert "a SolverAttempt entry was not written" in caplog.text


def test_a_log_entry_the_codec_cannot_write_costs_its_line_alone(tmp_path, caplog):
    """Training's logs (rollouts, completions, replay, audits) write plain entries the same way: an
    entry holding what JSON cannot say is skipped with a warning, never raised into the reward call."""
    path = tmp_path / "rollouts.jsonl"
    with JsonlWriter(path, fsync=False) as out:
        assert out.write({"step": 1, "metric": 0.5})
        assert not out.write({"step": 2, "metric": float("inf")})
        assert not out.write({"step": 3, "seen": {1, 2}})
        assert out.write({"step": 4, "text": "\ud800"})
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 4]
    assert caplog.text.count("a dict entry was not written") == 2


def test_a_surrogate_pair_held_as_two_code_points_is_refused_not_merged(tmp_path):
    """JSON reads "\\ud800\\udc00" back as the one character U+10000: a value holding the two code
    points is refused at parse time, and a record holding them costs that record."""
    task = make_task("t0", Replays({"v": "x\ud800\udc00y"}), Context(id="c", data={}), "", "m", {})
    assert not task.validity.valid and "surrogate pair" in task.validity.reason
    assert check_value("\ud800 \udc00") is None and check_value("\U00010000") is None
    path = tmp_path / "attempts.jsonl"
    with JsonlWriter(path) as out:
        assert not out.write(SolverAttempt(text="\ud83d\ude00", solved=False))
        assert out.write(SolverAttempt(text="\ud83d \ude00", solved=False))
    assert [attempt.text for attempt in iter_jsonl(path, SolverAttempt)] == ["\ud83d \ude00"]


class RaisingItems(dict):
    def items(self):
        raise KeyError("no")


class Lax(Verdict):
    """A verdict whose maker skipped the checks."""

    def __post_init__(self):
        pass


def test_what_a_grader_returns_is_recorded_or_makes_the_attempt_ungradable(tmp_path):
    """Hostile verdicts from a grader: a reason of another type, numpy's bool, a dict subclass as
    diagnostics, a nested key holding a split surrogate pair; each attempt is writable, and a
    verdict that is no verdict (solved 2) is ungradable, never an exception out of grading."""
    import collections

    numpy = pytest.importorskip("numpy")
    task = Task(id="t", domain="replays", context_id="c", generation="", validity=Validity.ok(), generator="m")

    class Returns(Replays):
        def __init__(self, verdict):
            self.verdict = verdict

        def grade(self, payload, attempt):
            return self.verdict()

    cases = {
        "numpy reason": lambda: Verdict(False, numpy.str_("bad output: \udcff")),
        "exception as reason": lambda: Verdict(False, ValueError("x")),
        "numpy bool": lambda: Verdict(numpy.bool_(True), None, {"markers": ["ran"]}),
        "ordered diagnostics": lambda: Verdict(False, None, collections.OrderedDict(markers=["ran"])),
        "pair in a nested key": lambda: Verdict(True, None, {"per_file": {"out_\ud83d\ude00.txt": 1}, "n": 1}),
        "no verdict": lambda: Verdict(2, None),
        "raising diagnostics": lambda: Verdict(True, None, RaisingItems(a=1)),
        "checks skipped": lambda: Lax(True, None, {"x": float("inf")}),
    }
    attempts = {name: grade_attempt(Returns(verdict), task, "x") for name, verdict in cases.items()}
    assert attempts["numpy reason"].reason == "bad output: \udcff" and attempts["numpy reason"].solved is False
    assert attempts["exception as reason"].reason == "(ValueError as reason)"
    assert attempts["numpy bool"].solved is True and attempts["numpy bool"].diagnostics == {"markers": ["ran"]}
    assert attempts["ordered diagnostics"].diagnostics == {"markers": ["ran"]}
    assert attempts["pair in a nested key"].diagnostics["per_file"] is None
    assert attempts["pair in a nested key"].diagnostics["n"] == 1
    assert attempts["no verdict"].solved is None and "not a value of type int" in attempts["no verdict"].reason
    assert attempts["raising diagnostics"].solved is None and "KeyError" in attempts["raising diagnostics"].reason
    assert attempts["checks skipped"].diagnostics["x"] is None
    with JsonlWriter(tmp_path / "attempts.jsonl") as out:
        assert all(out.write(attempt) for attempt in attempts.values())
        assert not out.write({"step": 1, "entry": RaisingItems(a=1)})
    assert len(list(iter_jsonl(tmp_path / "attempts.jsonl", SolverAttempt))) == len(cases)


def test_a_whole_write_removes_what_a_killed_writer_left_beside_the_file(tmp_path):
    """A kill between writing ``NAME.PID.tmp`` and moving it over ``NAME`` left it there for good, and a
    resumed run's folder held one file more than an uninterrupted run's (test_rounds saw it once)."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    target = tmp_path / "times.json"
    left = tmp_path / f"times.json.{int(gone.stdout)}.tmp"
    running = tmp_path / f"times.json.{os.getppid()}.tmp"  # a writer still alive keeps its own
    other = tmp_path / "times.jsonl.1.tmp"
    for each in (left, running, other):
        each.write_bytes(b"{")
    replace_whole(target, b"{}\n")
    assert target.read_bytes() == b"{}\n"
    assert not left.exists() and running.exists() and other.exists()
