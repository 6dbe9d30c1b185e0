"""Files and lines for people (report.html, exported columns, console lines) take any string a run
holds: records keep a lone surrogate, or the undecodable byte of a file name, exactly, and what
people read shows it as a ``\\u`` escape instead of ending the command."""

import json
import os

from propel_core.records import JsonlWriter, Label, SolverAttempt, Task, Validity

#: a lone surrogate a model wrote, and an undecodable byte as Python reads it from a file name
HOSTILE = "\ud800 and \udcff"
ESCAPED = ("\\ud800", "\\udcff")


def hostile_run(run_dir):
    """A run folder whose every string field holds ``HOSTILE``: a rejected and a labeled task, a
    reward log and the completions sampled from it."""
    tasks = [
        Task(
            id=f"t0{HOSTILE}",
            domain="countdown",
            context_id=HOSTILE,
            generation=HOSTILE,
            text=HOSTILE,
            validity=Validity.reject(HOSTILE),
            topic=HOSTILE,
            generator=HOSTILE,
        ),
        Task(
            id="t1",
            domain="countdown",
            context_id=HOSTILE,
            generation=HOSTILE,
            payload={HOSTILE: [HOSTILE]},
            text=HOSTILE,
            validity=Validity.ok(),
            topic=HOSTILE,
            generator=HOSTILE,
        ),
    ]
    attempt = SolverAttempt(text=HOSTILE, solved=True, reason=HOSTILE, diagnostics={HOSTILE: HOSTILE})
    with JsonlWriter(run_dir / "tasks.jsonl") as out, JsonlWriter(run_dir / "labels.jsonl") as labels:
        assert all(out.write(task) for task in tasks)
        assert labels.write(
            Label.from_attempts("t1", [attempt, attempt.model_copy(update={"solved": False})], (0, 1), 1)
        )
    log = {"step": 1, "rule": HOSTILE, "rule_options": {HOSTILE: HOSTILE}, "reward_mean": 0.5, "reward_std": 0.1}
    sampled = {"reward": 0.5, "valid": False, "reason": HOSTILE, "probability": None, "generation": HOSTILE}
    with JsonlWriter(run_dir / "train" / "reward_log.jsonl") as out:
        assert out.write(log | {"validity_rate": 0.5, "degenerate_groups": 0.0})
    with JsonlWriter(run_dir / "train" / "completions.jsonl") as out:
        assert out.write({"step": 1, "completions": [sampled]})


def test_a_run_whose_every_string_is_hostile_is_reported_and_exported(tmp_path, propel_cli):
    from datasets import load_from_disk

    run_dir = tmp_path / "run"
    hostile_run(run_dir)
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps({"run_dir": str(run_dir), "domain": {"name": "countdown"}, "label": {"k": 2}}))

    said = propel_cli("report", str(config))
    assert said.stdout.strip().endswith("run/report.html"), said.stdout
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    assert all(page.count(escaped) >= 4 for escaped in ESCAPED), page

    hostile_dir = run_dir.rename(tmp_path / os.fsdecode(b"run-\xff"))  # file names: not UTF-8
    exported = propel_cli("export", str(hostile_dir), "--to", str(tmp_path / "dataset"))
    assert "corpus: 2 rows" in exported.stdout
    (empty := tmp_path / os.fsdecode(b"empty-\xff")).mkdir()
    for args, problem in [
        ([str(empty), "--to", "x"], "empty-\\udcff holds no tasks.jsonl"),
        ([str(hostile_dir), "--to", str(tmp_path / os.fsdecode(b"dataset-\xff"))], "dataset-\\udcff is not valid"),
    ]:
        refused = propel_cli("export", *args, check=False)  # a file name on the console: one line
        assert refused.returncode == 1 and problem in refused.stderr and refused.stderr.count("\n") == 1
    rows = load_from_disk(str(tmp_path / "dataset"))["corpus"].to_list()
    assert [row["id"] for row in rows] == ["t0\\ud800 and \\udcff", "t1"]
    for row in rows:
        for field in ("context_id", "generation", "text", "rejection", "topic", "generator"):
            assert row[field] in (None, "\\ud800 and \\udcff"), (field, row[field])
    assert json.loads(rows[1]["payload"]) == {HOSTILE: [HOSTILE]}  # JSON text: \\u escapes read back exactly


def test_an_override_that_is_not_utf8_is_one_line(tmp_path, propel_cli):
    """Configs are YAML text, which cannot hold a file name's undecodable bytes: one line says so."""
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps({"domain": {"name": "countdown"}}))
    run_dir = tmp_path / os.fsdecode(b"run-\xff")
    refused = propel_cli("report", str(config), f"run_dir={run_dir}", check=False)
    assert refused.returncode != 0 and refused.stderr.count("\n") == 1, refused.stderr
    assert "run-\\udcff is not valid UTF-8" in refused.stderr


def test_tracker_text_takes_any_string(tmp_path):
    """Metric names and table columns a run makes from model text reach tensorboard escaped; a run
    folder whose name is not UTF-8 is one line before tensorboard writes anything."""
    import pytest

    from propel_core.errors import PropelError
    from propel_core.tracking import Tracker

    tracker = Tracker(["tensorboard"], tmp_path)
    tracker.log("evaluate", {f"arm{HOSTILE}/solve_rate": 0.5})
    tracker.table("probe", f"sweep{HOSTILE}", [{f"col{HOSTILE}": HOSTILE, "x": 1.0}])
    tracker.close()
    assert list((tmp_path / "tensorboard").glob("*/events.out.tfevents.*"))
    with pytest.raises(PropelError, match=r"tensorboard cannot write to .*run-\\udcff"):
        Tracker(["tensorboard"], tmp_path / os.fsdecode(b"run-\xff"))
