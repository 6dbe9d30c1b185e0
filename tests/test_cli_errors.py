"""What a new user runs into: a model path that does not exist, a read-only run folder, a full disk.
Each ends with one line on stderr naming the path and what to do, and a full disk keeps every record
written before it. The disks are real tmpfs mounts (root only)."""

import os
import subprocess

import pytest

from propel_core.errors import PropelError
from propel_core.records import JsonlWriter, Task, Validity, encode, iter_jsonl


@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs(options)`` mounts a fresh tmpfs and returns its folder; every mount is undone after the test."""
    mounted = []

    def mount(options: str):
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        folder = tmp_path / f"mnt{len(mounted)}"
        folder.mkdir()
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
        mounted.append(folder)
        return folder

    try:
        yield mount
    finally:
        for folder in mounted:
            subprocess.run(["umount", str(folder)], check=False)


def arithmetic_config(folder, run_dir):
    config = folder / "c.yaml"
    config.write_text(
        f"domain:\n  name: arithmetic\nrun_dir: {run_dir}\ngenerator:\n  sampling:\n    max_new_tokens: 4\n"
    )
    return config


def assert_one_line_error(result, *parts):
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("Error: ") and all(part in lines[-1] for part in parts), result.stderr
    assert not any(line.startswith("Error") for line in lines[:-1])


@pytest.mark.parametrize("model", ["/nonexistent/model", "./no/such/model", "missing.gguf"])
def test_missing_model_path(propel_cli, tmp_path, model):
    """A model named by a path is refused when the config is read, before the stage writes anything;
    a name that is no path (``missing.gguf``) when the stage looks for it, in one line."""
    config = arithmetic_config(tmp_path, tmp_path / "run")
    result = propel_cli("-q", "generate", str(config), f"generator.model={model}", check=False)
    said = f"model {os.path.normpath(model)} does not exist"
    hint = "give a local model folder, a .gguf file or a Hugging Face hub id"
    if "/" in model:
        assert result.returncode == 1 and "invalid config:" in result.stderr, result.stderr
        assert f"generator.model = '{model}'" in result.stderr and said in result.stderr and hint in result.stderr
        assert not (tmp_path / "run" / "tasks.jsonl").exists() and not (tmp_path / "run" / "config.yaml").exists()
    else:
        assert_one_line_error(result, said, hint)


def test_a_component_that_refuses_its_options_is_one_line(propel_cli, tmp_path):
    """A domain's constructor raising a plain ValueError on an option value it checks (arithmetic's
    solver_shots) ends the command in one line naming the domain, its plugin and the options, not a
    traceback through the CLI; nothing was written."""
    config = arithmetic_config(tmp_path, tmp_path / "run")
    result = propel_cli("-q", "generate", str(config), "domain.options.solver_shots=-1", check=False)
    assert_one_line_error(
        result,
        "domain 'arithmetic' of plugin 'arithmetic' could not be made (options: solver_shots=-1): ValueError: ",
        "solver_shots >= 0",
    )
    assert not (tmp_path / "run" / "tasks.jsonl").exists()


def test_folder_that_is_not_a_model(propel_cli, tmp_path):
    config = arithmetic_config(tmp_path, tmp_path / "run")
    (tmp_path / "empty").mkdir()
    result = propel_cli("-q", "generate", str(config), f"generator.model={tmp_path / 'empty'}", check=False)
    assert_one_line_error(result, f"model {tmp_path / 'empty'} is a folder without a config.json")


def test_gguf_file_is_converted_once(tmp_path, monkeypatch):
    from propel_core import embedded

    monkeypatch.setenv("PROPEL_CACHE", str(tmp_path / "cache"))
    converted = []

    def convert(gguf, target):
        converted.append(gguf)
        target.mkdir(parents=True)
        (target / "model.safetensors").write_bytes(b"")

    monkeypatch.setattr(embedded, "_convert_gguf", convert)
    gguf = tmp_path / "tiny.Q4.gguf"
    gguf.write_bytes(b"GGUF")
    first = embedded.resolve_model(str(gguf))
    assert first.startswith(str(tmp_path / "cache" / "gguf" / "tiny.Q4-"))
    assert embedded.resolve_model(str(gguf)) == first and converted == [gguf]
    assert embedded.resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert embedded.resolve_model(str(tmp_path)) == str(tmp_path)


def test_read_only_run_folder(propel_cli, tmp_path, tmpfs):
    read_only = tmpfs("ro")
    config = arithmetic_config(tmp_path, read_only / "run")
    result = propel_cli("-q", "generate", str(config), check=False)
    assert_one_line_error(result, str(read_only / "run"), "read-only file system: set run_dir to a writable folder")


def make_task(i: int) -> Task:
    return Task(id=f"t{i}", domain="d", context_id="c", generation="g" * 300, validity=Validity.ok(), generator="m")


def test_writer_on_a_full_disk_keeps_whole_records(tmpfs):
    path = tmpfs("size=16k") / "tasks.jsonl"
    written = 0
    with JsonlWriter(path) as out, pytest.raises(PropelError, match=r"tasks\.jsonl: no space left on the device"):
        for i in range(1000):
            out.write(make_task(i))
            written += 1
    assert written > 0
    assert path.read_bytes() == b"".join(encode(make_task(i)) + b"\n" for i in range(written))


@pytest.mark.slow
def test_full_disk_during_generate_keeps_records_and_resumes(propel_cli, tmp_path, tmpfs):
    disk = tmpfs("size=256k")
    filler = disk / "filler"
    config = arithmetic_config(tmp_path, disk / "run")
    tasks_file = disk / "run" / "tasks.jsonl"
    # pages left for config.yaml (the resolved config, whose size depends on the run folder's path),
    # .propel.lock (who holds the folder) and settings.json (under a page each) and the first page of tasks
    resolved = propel_cli("config", str(config), "generate.num_tasks=16").stdout.encode()
    pages = -(-len(resolved) // 4096) + 3
    filler.write_bytes(b"\0" * (256 * 1024 - pages * 4096))
    result = propel_cli("-q", "generate", str(config), "generate.num_tasks=16", check=False)
    assert_one_line_error(result, f"{tasks_file}: no space left on the device", "rerun the command to go on")
    kept = list(iter_jsonl(tasks_file, Task))
    assert (disk / "run" / "config.yaml").read_bytes() == resolved and (
        disk / "run" / "settings.json"
    ).stat().st_size < 4096
    assert 0 < len(kept) < 16  # records of 250+ bytes: about 13 fit in the page left
    assert tasks_file.read_bytes().count(b"\n") == len(kept) and tasks_file.read_bytes().endswith(b"\n")

    filler.unlink()
    propel_cli("-q", "generate", str(config), "generate.num_tasks=16")
    resumed = list(iter_jsonl(tasks_file, Task))
    assert sorted(t.id for t in resumed) == [f"t{i:06d}" for i in range(16)]
    by_id = {task.id: task for task in resumed}  # the finished file is in task-id order
    assert all(by_id[task.id] == task for task in kept)
