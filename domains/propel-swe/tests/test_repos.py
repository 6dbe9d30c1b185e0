"""Repository specs, the YAML registry, SWE-smith import and repo-disjoint splits."""

import json

import pytest
import yaml

from propel_core.errors import PropelError
from propel_swe.repos import RepoSpec, load_registry
from propel_swe.verifier import Baseline, node_ids


def write(path, data):
    path.write_text(yaml.safe_dump(data))
    return path


def test_registry_with_splits_and_relative_paths(tmp_path):
    (tmp_path / "r1").mkdir()
    path = write(
        tmp_path / "repos.yaml",
        {
            "repos": [{"name": "r1", "path": "r1"}, {"name": "r2", "image": "img:2"}, {"name": "r3", "image": "img:3"}],
            "splits": {"probe_train": ["r1"], "rl_train": ["r2"], "eval": ["r3"]},
        },
    )
    registry = load_registry(path)
    assert registry.repos[0].path == (tmp_path / "r1").resolve()
    assert [repo.name for repo in registry.select("rl_train")] == ["r2"]
    assert len(registry.select(None)) == 3
    with pytest.raises(PropelError, match="unknown split 'test'; the registry has: eval, probe_train, rl_train"):
        registry.select("test")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"repos": [{"name": "a", "image": "i"}], "splits": {"x": ["a"], "y": ["a"]}}, "repo-disjoint"),
        ({"repos": [{"name": "a", "image": "i"}], "splits": {"x": ["b"]}}, "unknown repositories: b"),
        ({"repos": [{"name": "a"}]}, "needs a path"),
        ({"repos": [{"name": "a", "image": "i"}, {"name": "a", "image": "j"}]}, "repeated: a"),
        ({"repos": [{"name": "a", "image": "i", "parser": "tap"}]}, "pytest"),
        ({"repos": [{"name": "a", "image": "i", "env": {"A-B": "1"}}]}, "shell variable names: A-B"),
    ],
)
def test_bad_registries(tmp_path, data, message):
    with pytest.raises(PropelError, match=message):
        load_registry(write(tmp_path / "repos.yaml", data))


def test_swesmith_import(tmp_path):
    rows = [
        {
            "repo": "owner/lib",
            "commit": "0123456789abcdef",
            "image_name": "swesmith/owner__lib.01234567",
            "test_cmd": "pytest --disable-warnings",
        }
    ]
    (tmp_path / "swesmith.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    direct = load_registry(tmp_path / "swesmith.jsonl")
    assert direct.repos[0].name == "owner/lib@01234567" and direct.repos[0].image == "swesmith/owner__lib.01234567"
    mixed = load_registry(
        write(
            tmp_path / "repos.yaml",
            {"swesmith": ["swesmith.jsonl"], "repos": [], "splits": {"eval": ["owner/lib@01234567"]}},
        )
    )
    assert [r.test_command for r in mixed.select("eval")] == ["pytest --disable-warnings"]
    (tmp_path / "bad.json").write_text(json.dumps([{"repo": "x"}]))
    with pytest.raises(PropelError, match="missing image_name, test_cmd"):
        load_registry(tmp_path / "bad.json")


def test_two_processes_building_one_cached_folder_take_turns(tmp_path):
    """``exclusive`` (what python_environment and sdist_checkout hold while they build): a second real
    process that asks for the lock while the first holds it gets it only after the first let go."""
    import subprocess
    import sys
    import time

    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from propel_swe.checkout import exclusive\n"
        "with exclusive(Path(sys.argv[1])):\n"
        "    start = time.monotonic()\n"
        "    Path(sys.argv[3]).touch()\n"
        "    time.sleep(1.0)\n"
        "    open(sys.argv[2], 'a').write(f'{start} {time.monotonic()}\\n')\n"
    )
    lock, log = tmp_path / "lock", tmp_path / "held"
    run = lambda name: subprocess.Popen([sys.executable, "-c", script, str(lock), str(log), str(tmp_path / name)])  # noqa: E731
    first = run("first holds it")
    deadline = time.monotonic() + 60
    while not (tmp_path / "first holds it").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    second = run("second holds it")  # asks while the first holds the lock
    assert [first.wait(timeout=60), second.wait(timeout=60)] == [0, 0]
    spans = [tuple(map(float, line.split())) for line in log.read_text().splitlines()]
    assert len(spans) == 2 and spans[0][1] <= spans[1][0]  # the second began after the first let go


def test_the_tests_environment_comes_from_the_test_command_and_env():
    spec = RepoSpec(name="a", image="i", test_command="env A=1 B='x y' python -m pytest -q", env={"C": "$HOME"})
    assert spec.test_environment() == (["export A=1", "export B='x y'", "export C='$HOME'"], "python -m pytest -q")
    assert spec.variables() == ["A", "B", "C"]
    expanded = RepoSpec(name="b", image="i", test_command="PYTHONPATH=src:$PYTHONPATH pytest && echo done")
    assert expanded.test_environment() == (["export PYTHONPATH=src:$PYTHONPATH"], "pytest && echo done")
    plain = RepoSpec(name="c", image="i")
    assert plain.test_environment() == ([], plain.test_command)
    assert spec.key() != RepoSpec(name="a", image="i", test_command=spec.test_command).key()  # env is part of it


def test_failing_tests_stored_as_junit_names_are_read_as_node_ids():
    """Tasks verified before the runners read node ids stored JUnit names; they stay gradable."""
    tests = {"tests/test_x.py::Case::test_a": "passed", "tests/test_x.py::test_b[1-2]": "passed"}
    baseline = Baseline(repo="r", key="k", status="ok", tests=tests)
    stored = ["tests.test_x.Case::test_a", "tests/test_x.py::test_b[1-2]", "tests.test_x::test_b[1-2]"]
    assert node_ids(stored, baseline) == [*tests, "tests/test_x.py::test_b[1-2]"]
    with pytest.raises(PropelError, match=r"'tests.test_y::test_c' is neither .* verify it again"):
        node_ids(["tests.test_y::test_c"], baseline)
