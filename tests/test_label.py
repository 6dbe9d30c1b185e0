"""propel label on the embedded solver: K attempts per task, graded; resumable after kill -9."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from propel_core.domain import make_task
from propel_core.plugins import Registry
from propel_core.records import JsonlWriter, Label, Task, iter_jsonl
from propel_core.testing import kill_when_written

pytestmark = pytest.mark.slow

PUZZLES = [
    "Target: 24\nNumbers: 3, 8, 8",
    "Target: 10\nNumbers: 2, 3, 5",
    "Target: 12\nNumbers: 4, 3, 1",
    "Target: 7\nNumbers: 1, 2, 4",
    "Target: 30\nNumbers: 5, 6, 2",
    "Target: 15\nNumbers: 3, 5, 7",
]


@pytest.fixture
def run_dir(tmp_path) -> Path:
    return write_run(tmp_path)


def write_run(tmp_path: Path) -> Path:
    """A run folder whose tasks.jsonl holds six valid countdown tasks and one invalid one."""
    registry = Registry.build()
    domain = registry.domain("countdown")
    predicates = registry.validity_predicates(domain)
    with JsonlWriter(tmp_path / "tasks.jsonl") as out:
        for i, text in enumerate([*PUZZLES, "Target: 99\nNumbers: 1, 1, 1"]):
            out.write(make_task(f"t{i}", domain, domain.contexts()[0], text, "hand", predicates))
    (tmp_path / "run.yaml").write_text(
        f"run_dir: {tmp_path}\ndomain: {{name: countdown}}\nlabel: {{k: 3}}\n"
        "solver: {sampling: {max_new_tokens: 24}}\n"
    )
    return tmp_path


def by_task(path: Path) -> list[Label]:
    return sorted(list(iter_jsonl(path, Label)), key=lambda label: label.task_id)


@pytest.fixture(scope="module")
def one_at_a_time(tmp_path_factory) -> list[Label]:
    """The labels of an uninterrupted run with one worker: what every other run must write."""
    folder = tmp_path_factory.mktemp("one-worker")
    write_run(folder)
    subprocess.run(
        [str(Path(sys.executable).with_name("propel")), "-q", "label", str(folder / "run.yaml"), "executor.workers=1"],
        check=True,
        capture_output=True,
    )
    return by_task(folder / "labels.jsonl")


def test_labels_every_valid_task(run_dir, propel_cli, one_at_a_time):
    out = propel_cli("-q", "label", str(run_dir / "run.yaml"), "executor.workers=4").stdout
    labels = list(iter_jsonl(run_dir / "labels.jsonl", Label))
    assert by_task(run_dir / "labels.jsonl") == one_at_a_time  # 4 workers write what 1 writes
    assert sorted(label.task_id for label in labels) == [f"t{i}" for i in range(6)]  # not the invalid t6
    for label in labels:
        assert len(label.attempts) == 3 and label.band == (1 / 8, 3 / 8)
        solved = sum(bool(a.solved) for a in label.attempts)
        assert label.valid_attempts == 3 and label.solve_rate == solved / 3
        assert label.utility == int(1 / 8 <= solved / 3 <= 3 / 8)
        assert all(a.solved is not None and "missing_answer" in a.diagnostics for a in label.attempts)
    assert out.startswith("labeled 6: in band ")


def test_resumes_after_kill_9(run_dir, one_at_a_time):
    """Kill a labeling process with 4 attempts in flight; the rerun keeps every finished label, writes
    none twice, and ends with exactly the labels of an uninterrupted run."""
    labels_path = run_dir / "labels.jsonl"
    command = [
        str(Path(sys.executable).with_name("propel")),
        "-q",
        "label",
        str(run_dir / "run.yaml"),
        "executor.workers=4",
    ]
    kill_when_written(command, labels_path, 2)
    before = list(iter_jsonl(labels_path, Label))
    assert 2 <= len(before) < 6

    subprocess.run(command, check=True, capture_output=True)
    after = list(iter_jsonl(labels_path, Label))
    assert after[: len(before)] == before  # finished labels untouched
    assert sorted(label.task_id for label in after) == [f"t{i}" for i in range(6)]  # each exactly once
    assert by_task(labels_path) == one_at_a_time
    assert not (run_dir / "labels.attempts.jsonl").exists()  # the journal goes once every label is whole


def test_ctrl_c_stops_the_workers_and_keeps_finished_records(run_dir, one_at_a_time):
    labels_path = run_dir / "labels.jsonl"
    command = [
        str(Path(sys.executable).with_name("propel")),
        "-q",
        "label",
        str(run_dir / "run.yaml"),
        "executor.workers=4",
    ]
    # a shell starts a background job with SIGINT ignored, and a child inherits that: give it the default
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (labels_path.exists() and labels_path.read_bytes().count(b"\n")):
        time.sleep(0.05)
    seen = labels_path.read_bytes().count(b"\n")
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)  # the workers stop: no hang
    written = labels_path.read_bytes().count(b"\n")
    assert process.returncode == 1 and "interrupted; finished records are kept" in stderr, (
        f"exit {process.returncode}, {seen} labels when interrupted, {written} at the end; stderr: {stderr[-3000:]}"
    )
    kept = list(iter_jsonl(labels_path, Label))
    assert 1 <= len(kept) < 6 and all(label in one_at_a_time for label in kept)
    subprocess.run(command, check=True, capture_output=True)
    assert by_task(labels_path) == one_at_a_time


def test_missing_tasks_is_a_clear_error_and_no_valid_tasks_is_not(tmp_path, propel_cli):
    (tmp_path / "run.yaml").write_text(f"run_dir: {tmp_path}\ndomain: {{name: countdown}}\n")
    result = propel_cli("label", str(tmp_path / "run.yaml"), check=False)
    assert result.returncode == 1 and "tasks.jsonl does not exist: run `propel generate` first" in result.stderr
    (tmp_path / "tasks.jsonl").write_text("")
    result = propel_cli("label", str(tmp_path / "run.yaml"))
    assert "no valid tasks" in result.stderr and result.stdout.startswith("labeled 0:")


def test_tasks_untouched(run_dir, propel_cli):
    before = (run_dir / "tasks.jsonl").read_bytes()
    propel_cli("-q", "label", str(run_dir / "run.yaml"), "label.k=1")
    assert (run_dir / "tasks.jsonl").read_bytes() == before
    assert len(list(iter_jsonl(run_dir / "tasks.jsonl", Task))) == 7
