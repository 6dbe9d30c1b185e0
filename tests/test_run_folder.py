"""One command per run folder, and nothing deleted silently (issue 57): a second command on a held
folder is refused naming the holder, a folder held by a killed process is taken over, a changed
setting is refused from a training's first logged step, and a rerun resumes, refuses, or (asked to
start over) moves the old training aside. No test trains: each writes the records a folder would hold."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from propel_core.cli import cli
from propel_core.folder_lock import LOCK
from propel_core.plans import validate_config
from propel_core.provenance import claim

#: a process that holds the folder it is given until it is killed, as a command working there does
HOLDS = (
    "import sys, time; from propel_core.folder_lock import hold; hold(sys.argv[1]); "
    "print('held', flush=True); time.sleep(600)"
)


def propel(*args: str):
    """The ``propel`` command line, run in this process (each command lets go of its folder at its end)."""
    return CliRunner().invoke(cli, list(args))


def holder(folder: Path) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", HOLDS, str(folder)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "held\n"
    return process


def config_file(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "run.yaml"
    path.write_text(f"run_dir: {folder}\ndomain: {{name: countdown}}\n")
    return path


def test_a_second_command_is_refused_naming_the_holder_and_a_killed_holders_folder_is_taken_over(tmp_path):
    run = tmp_path / "run"
    cfg = config_file(run)
    held = holder(run)
    try:
        refused = propel("label", str(cfg))
        assert refused.exit_code == 1
        line = refused.output.strip()
        assert "\n" not in line and f"is in use by another command (pid {held.pid} on " in line
        assert "`-c " in line and " since " in line and "use another run_dir" in line
        assert not (run / "config.yaml").exists()  # refused before it wrote anything
    finally:
        os.kill(held.pid, signal.SIGKILL)  # as a lost node: the kernel lets go of its lock
        held.wait()

    taken = propel("label", str(cfg))
    assert "in use" not in taken.output and "tasks.jsonl does not exist" in taken.output  # past the lock
    assert (run / LOCK).read_text() == ""  # it ended and let go: the file names no holder (the same after any run)
    assert (run / "config.yaml").exists()
    again = propel("label", str(cfg))  # the command before let go at its end
    assert "tasks.jsonl does not exist" in again.output


def hard_training(run: Path, *records: str) -> Path:
    """A run whose train/ a `hard` training wrote ``records`` into, its settings claimed; no checkpoint."""
    cfg = config_file(run)
    config = validate_config({"run_dir": str(run), "domain": {"name": "countdown"}}).model_dump(mode="json")
    claim(run, "train", config, False, False, ("reward.options.hard",), {"reward.bundles": [None]})
    (run / "train").mkdir()
    for name in records:
        (run / "train" / name).write_text(json.dumps({"step": 0, "reward_mean": 0.5}) + "\n")
    return cfg


def test_a_changed_reward_rule_is_refused_after_one_logged_step_and_a_plain_rerun_deletes_nothing(tmp_path):
    cfg = hard_training(tmp_path, "reward_log.jsonl", "completions.jsonl")
    before = {path.name: path.read_bytes() for path in (tmp_path / "train").iterdir()}

    soft = propel("-q", "train", str(cfg), "reward.rule=soft")
    assert soft.exit_code == 1 and "train was made with other settings (" in soft.output
    assert 'reward.rule: "hard" -> "soft"' in soft.output and soft.output.count("\n") == 1
    same = propel("-q", "train", str(cfg))
    assert same.exit_code == 1
    assert "holds a training (completions.jsonl, reward_log.jsonl) but no checkpoint to resume from" in same.output
    assert "checkpoint.resume=false" in same.output and "not deleted" in same.output
    assert {path.name: path.read_bytes() for path in (tmp_path / "train").iterdir()} == before
    recorded = json.loads((tmp_path / "settings.json").read_text())["train"]
    assert recorded["reward.rule"] == "hard"


def test_starting_over_moves_the_old_training_aside_and_says_where(tmp_path):
    run = tmp_path / "run"
    cfg = config_file(run)
    folder = run / "solve" / "trained-tasks"
    (folder / "checkpoint-3").mkdir(parents=True)  # cut before its trainer_state: nothing to resume from
    (folder / "checkpoint-3" / "adapter_model.safetensors").write_bytes(b"weights")
    (folder / "rollouts.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
    (folder / "reward_log.jsonl").write_text('{"step": 0}\n')
    before = {str(path.relative_to(folder)): path.read_bytes() for path in folder.rglob("*") if path.is_file()}

    plain = propel("-q", "solve-train", str(cfg))
    assert plain.exit_code == 1 and "no checkpoint to resume from" in plain.output
    over = propel("-q", "solve-train", str(cfg), "checkpoint.resume=false")
    assert over.exit_code == 1 and "eval/trained/tasks.jsonl does not exist" in over.output  # after the move
    (aside,) = (run / "solve").glob("trained-tasks.old-*")
    assert f"starting {folder} over: the training it held is kept in {aside}\n" in over.output
    assert {str(path.relative_to(aside)): path.read_bytes() for path in aside.rglob("*") if path.is_file()} == before
    assert folder.is_dir() and not any(folder.iterdir())

    (folder / "log.jsonl").write_text("{}\n")  # started over again within the same second: another name
    propel("-q", "solve-train", str(cfg), "checkpoint.resume=false")
    assert len(list((run / "solve").glob("trained-tasks.old-*"))) == 2
