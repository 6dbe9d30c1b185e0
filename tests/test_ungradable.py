"""A grader that raises, met through the real ``propel`` command: one line per kind of error while it
runs and one summary line at the end, exit status 3, null labels shown as unknown (not 'solved 0/K'),
and ``--redo-ungradable`` turning them into real labels once the grader is fixed. Also what
``propel report`` says about a stage that refused."""

import os
import re
from pathlib import Path

import pytest

from propel_core.domain import make_task
from propel_core.execution import AttemptRecord, journal_path, reopen_ungradable
from propel_core.plugins import Registry, get_plugin_manager
from propel_core.records import JsonlWriter, Label, SolverAttempt, Task, iter_jsonl

#: a third-party domain: countdown, whose grader raises on even targets until FRAGILE_GRADER_FIXED is set
FRAGILE = """
import os
import threading

from propel_core import Verdict, hookimpl
from propel_countdown.plugin import Countdown


@hookimpl
def register_domains(register):
    register("fragile_countdown", Fragile)
    register("flaky_countdown", Flaky)


class Fragile(Countdown):
    def grade(self, payload, attempt):
        if payload["target"] % 2 == 0 and not os.environ.get("FRAGILE_GRADER_FIXED"):
            raise ValueError(f"no grader for target {payload['target']}")
        return super().grade(payload, attempt)


SEEN, LOCK = set(), threading.Lock()


class Flaky(Countdown):
    # the first grading of each attempt fails as an overloaded sandbox fails it

    def grade(self, payload, attempt):
        with LOCK:
            first = (payload["target"], attempt) not in SEEN
            SEEN.add((payload["target"], attempt))
        if first:
            return Verdict(None, "sandbox_error: overloaded: the machine was too busy to judge the run")
        return super().grade(payload, attempt)
"""

#: two even targets (ungradable until fixed), two odd ones
PUZZLES = ["Target: 24\nNumbers: 3, 8, 8", "Target: 7\nNumbers: 1, 2, 4", "Target: 10\nNumbers: 2, 3, 5"]
PUZZLES += ["Target: 15\nNumbers: 3, 5, 7"]
SUMMARY = re.compile(
    r"label: 4 of 8 attempts ungradable \(grader failed: ValueError: no grader for target (24|10), 3 more like "
    r"it\); rerun with --redo-ungradable after fixing the cause"
)


@pytest.fixture
def fragile_plugin(tmp_path, monkeypatch):
    """The fragile domain installed beside the core as pip leaves a package (dist-info, entry point)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "propel_test_fragile.py").write_text(FRAGILE)
    info = site / "propel_test_fragile-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: propel-test-fragile\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[propel]\nfragile = propel_test_fragile\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("PROPEL_LOAD_PLUGINS", raising=False)
    monkeypatch.delenv("FRAGILE_GRADER_FIXED", raising=False)
    return site


def fragile_run(folder: Path, name: str = "fragile_countdown") -> Path:
    """A run folder with the four puzzles as valid tasks of domain ``name``; returns its config."""
    registry = Registry.build(get_plugin_manager())
    domain = registry.domain(name)
    predicates = registry.validity_predicates(domain)
    with JsonlWriter(folder / "tasks.jsonl") as out:
        for i, text in enumerate(PUZZLES):
            task = make_task(f"t{i}", domain, domain.contexts()[0], text, "hand", predicates)
            assert task.validity.valid, task.validity.reason
            out.write(task)
    config = folder / "run.yaml"
    config.write_text(
        f"run_dir: {folder}\ndomain: {{name: {name}}}\n"
        "label: {k: 2, band_low: 0.25, band_high: 0.75}\nsolver: {sampling: {max_new_tokens: 24}}\n"
    )
    return config


def by_task(path: Path) -> dict[str, Label]:
    return {label.task_id: label for label in iter_jsonl(path, Label)}


def grader_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "grader" in line or "ungradable" in line]


@pytest.mark.slow
def test_a_raising_grader_is_summed_up_exits_3_and_is_redone_after_the_fix(
    fragile_plugin, propel_cli, tmp_path, monkeypatch
):
    config = fragile_run(tmp_path)
    first = propel_cli("-q", "label", str(config), check=False)
    assert first.returncode == 3, first.stderr
    assert "Traceback" not in first.stderr
    lines = grader_lines(first.stderr)
    # one line for the kind of error as it is met (two messages, four attempts: one kind), one at the end
    assert len(lines) == 2, first.stderr
    assert lines[0].startswith("label: task t") and "an attempt is ungradable: grader failed: ValueError" in lines[0]
    assert SUMMARY.fullmatch(lines[1]), lines[1]
    labels = by_task(tmp_path / "labels.jsonl")
    assert [labels[t].utility is None and labels[t].solve_rate is None for t in ("t0", "t2")] == [True, True]
    assert all(labels[t].solve_rate is not None for t in ("t1", "t3"))
    # each ungradable attempt was graded three times in all, and says why the first two failed
    retried = [a.retries for t in ("t0", "t2") for a in labels[t].attempts]
    assert all(len(reasons) == 2 and reasons[0].startswith("grader failed: ValueError") for reasons in retried)
    assert all(a.retries == [] for t in ("t1", "t3") for a in labels[t].attempts)
    summary = first.stdout.splitlines()
    assert summary[0].endswith("unknown 2") and summary[1].endswith("unknown: 2"), first.stdout
    histogram = [int(count) for count in re.findall(r"\d/2: (\d+)", summary[1])]
    assert sum(histogram) == 2  # the two null labels are not counted as solved 0/2

    again = propel_cli("-q", "label", str(config), check=False)  # nothing fixed: the hint again, status 3
    assert again.returncode == 3 and SUMMARY.fullmatch(grader_lines(again.stderr)[-1]), again.stderr
    assert by_task(tmp_path / "labels.jsonl") == labels

    monkeypatch.setenv("FRAGILE_GRADER_FIXED", "1")
    redone = propel_cli("-q", "label", str(config), "--redo-ungradable", check=False)
    assert redone.returncode == 0, redone.stderr
    assert grader_lines(redone.stderr) == []
    after = by_task(tmp_path / "labels.jsonl")
    assert sorted(after) == ["t0", "t1", "t2", "t3"] and not journal_path(tmp_path / "labels.jsonl").exists()
    assert all(label.utility is not None and label.valid_attempts == 2 for label in after.values())
    assert after["t1"] == labels["t1"] and after["t3"] == labels["t3"]  # gradable labels kept as they were

    # what the redo wrote is what a run with a working grader writes from the start
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    clean = propel_cli("-q", "label", str(fragile_run(fresh)), check=False)
    assert clean.returncode == 0, clean.stderr
    assert by_task(fresh / "labels.jsonl") == after


@pytest.mark.slow
def test_an_attempt_the_harness_could_not_grade_is_graded_again_never_failed(fragile_plugin, propel_cli, tmp_path):
    """A grader whose harness fails the first grading of every attempt (an overloaded machine): the
    label stage grades each again, finishes with no ungradable attempt, and every verdict is the one
    countdown's own grader gives the attempt's text; an attempt records why its first try failed."""
    config = fragile_run(tmp_path, "flaky_countdown")
    done = propel_cli("-q", "label", str(config), check=False)
    assert done.returncode == 0 and grader_lines(done.stderr) == [], done.stderr
    countdown = Registry.build().domain("countdown")
    tasks = {task.id: task for task in iter_jsonl(tmp_path / "tasks.jsonl", Task)}
    labels = by_task(tmp_path / "labels.jsonl")
    assert sorted(labels) == ["t0", "t1", "t2", "t3"]
    attempts = [(label.task_id, attempt) for label in labels.values() for attempt in label.attempts]
    for task_id, attempt in attempts:
        assert attempt.solved is countdown.grade(tasks[task_id].payload, attempt.text).solved
        assert attempt.retries in ([], ["sandbox_error: overloaded: the machine was too busy to judge the run"])
    # the harness failed once for each distinct text at a task (a repeated text was graded before)
    assert sum(bool(a.retries) for _, a in attempts) == len({(t, a.text) for t, a in attempts}) > 0


def test_reopening_keeps_the_gradable_attempts_in_the_journal(tmp_path):
    """A label with one ungradable attempt leaves the labels file; its gradable attempt waits in the
    journal, so labeling the task again runs only the ungradable one."""
    path = tmp_path / "labels.jsonl"
    good = [SolverAttempt(text="a", solved=True), SolverAttempt(text="b", solved=False)]
    mixed = [SolverAttempt(text="c", solved=None, reason="grader failed: ValueError: x"), good[0]]
    with JsonlWriter(path) as out:
        out.write(Label.from_attempts("t0", good, (0.25, 0.75), 1))
        out.write(Label.from_attempts("t1", mixed, (0.25, 0.75), 1))
    reopen_ungradable(path)
    assert list(by_task(path)) == ["t0"]
    journaled = list(iter_jsonl(journal_path(path), AttemptRecord))
    assert journaled == [AttemptRecord(task_id="t1", index=1, attempt=good[0])]
    reopen_ungradable(path)  # nothing left to reopen: nothing changes
    assert list(by_task(path)) == ["t0"] and len(list(iter_jsonl(journal_path(path), AttemptRecord))) == 1


def test_the_report_says_why_a_stage_refused(propel_cli, tmp_path):
    """A stage that refuses leaves its reason for propel report, which shows it in the stage's section
    and in the sections of the stages after it; a finished rerun clears it. No model runs."""
    registry = Registry.build()
    domain = registry.domain("countdown")
    predicates = registry.validity_predicates(domain)
    config = tmp_path / "run.yaml"
    config.write_text(f"run_dir: {tmp_path}\ndomain: {{name: countdown}}\nlabel: {{k: 2}}\n")

    refused = propel_cli("-q", "label", str(config), check=False)  # no tasks.jsonl yet
    assert refused.returncode == 1 and "run `propel generate` first" in refused.stderr
    propel_cli("-q", "report", str(config))
    page = (tmp_path / "report.html").read_text()
    assert "<code>propel label</code> refused: " in page and "run `propel generate` first" in page

    tasks = [make_task(f"t{i}", domain, domain.contexts()[0], p, "hand", predicates) for i, p in enumerate(PUZZLES)]
    with JsonlWriter(tmp_path / "tasks.jsonl") as out, JsonlWriter(tmp_path / "labels.jsonl") as labels:
        for task in tasks[:3]:
            out.write(task)
            attempts = [SolverAttempt(text="", solved=False)] * 2
            labels.write(Label.from_attempts(task.id, attempts, (1 / 8, 3 / 8), 1))
    assert all(isinstance(task, Task) and task.validity.valid for task in tasks)
    labeled = propel_cli("-q", "label", str(config))  # every task has its label: nothing to run
    assert labeled.returncode == 0 and labeled.stdout.startswith("labeled 3: in band 0, outside 3, unknown 0")

    probe = propel_cli("-q", "probe", str(config), check=False)
    assert probe.returncode == 1 and "all 3 labeled tasks are outside the band" in probe.stderr
    propel_cli("-q", "report", str(config))
    page = (tmp_path / "report.html").read_text()
    assert "<code>propel label</code> refused" not in page  # it has finished since
    assert "<code>propel probe</code> refused: all 3 labeled tasks are outside the band" in page
    assert "<code>propel train</code> comes after <code>propel probe</code>, which refused: all 3" in page
