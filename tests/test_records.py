"""Records and crash-safe JSONL files."""

from propel_core.records import JsonlWriter, Label, SolverAttempt, Task, Validity, iter_jsonl


def make_task(i: int) -> Task:
    return Task(id=f"t{i}", domain="d", context_id="c", generation="g", validity=Validity.ok(), generator="m")


def test_round_trip(tmp_path):
    path = tmp_path / "tasks.jsonl"
    with JsonlWriter(path) as out:
        for i in range(3):
            out.write(make_task(i))
    assert [t.id for t in list(iter_jsonl(path, Task))] == ["t0", "t1", "t2"]
    assert path.read_text().count("\n") == 3


def test_torn_tail_is_skipped_then_cut(tmp_path):
    path = tmp_path / "tasks.jsonl"
    with JsonlWriter(path) as out:
        out.write(make_task(0))
    with path.open("a") as f:
        f.write('{"id": "t1", "dom')  # a crash mid-line
    assert [t.id for t in list(iter_jsonl(path, Task))] == ["t0"]
    with JsonlWriter(path) as out:
        out.write(make_task(2))
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
