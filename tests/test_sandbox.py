"""The local sandbox: result statuses, isolation facts, and failing closed."""

import shutil
import subprocess
import sys

import pytest

from propel_core.errors import PropelError
from propel_plugins.sandbox import STATUSES, LocalSandbox, SandboxUnavailable


@pytest.fixture(scope="module")
def sandbox():
    box = LocalSandbox(time_limit=2.0, memory_mb=256, max_output_bytes=1 << 16)
    if box.missing_layers():
        pytest.skip(f"needs: {box.missing_layers()}")
    return box


def run(sandbox, code: str, **kwargs):
    return sandbox.run_python({"main.py": code}, "main.py", **kwargs)


RESULT = "import json\njson.dump({value}, open('result.json', 'w'))\n"


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (RESULT.format(value="[1, 'a', None]"), "ok"),
        ("raise ValueError('boom')", "error"),
        ("while True:\n    pass", "timeout"),
        ("x = bytearray(1 << 30)", "oom"),
        ("print('y' * (1 << 20))", "output_limit"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", "crashed"),
        ("print('done, but no result')", "no_result"),
        ("open('result.json', 'w').write('{not json')", "no_result"),
    ],
)
def test_status(sandbox, code, status):
    result = run(sandbox, code)
    assert result.status == status, (result.status, result.detail, result.stderr[-300:])
    assert result.status in STATUSES


def test_result_is_data(sandbox):
    result = run(sandbox, RESULT.format(value="{'k': [1, 2.5, True]}"))
    assert result.result == {"k": [1, 2.5, True]}


def test_isolation_facts(sandbox, tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_SECRET", "s3cret")
    code = (
        "import json, os\n"
        "facts = {'uid': os.getuid(), 'gid': os.getgid(), 'groups': os.getgroups(), 'pid': os.getpid(),\n"
        "         'env': sorted(os.environ), 'cwd': os.getcwd(), 'hash': hash('propel'),\n"
        "         'tmp': os.path.exists('/tmp'), 'home': os.path.exists('/root'),\n"
        "         'caps': open('/proc/self/status').read().split('CapEff:')[1].split()[0]}\n"
        "json.dump(facts, open('result.json', 'w'))\n"
    )
    one, two = run(sandbox, code, hash_seed=1).result, run(sandbox, code, hash_seed=2).result
    assert (one["uid"], one["gid"], one["groups"]) == (65534, 65534, [])
    assert one["caps"] == "0000000000000000"
    assert one["pid"] < 10  # its own pid namespace
    assert one["env"] == ["HOME", "LC_CTYPE", "PATH", "PWD", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED", "TMPDIR"]
    assert one["cwd"] == "/work" and not one["tmp"] and not one["home"]
    assert one["hash"] != two["hash"]  # the hash seed reaches the program


def test_refuses_without_a_layer(monkeypatch):
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "bwrap" else real_which(name))
    with pytest.raises(SandboxUnavailable, match=r"missing: bubblewrap .* allow_unisolated"):
        LocalSandbox()


def test_runs_degraded_only_when_allowed(monkeypatch, caplog):
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "bwrap" else real_which(name))
    box = LocalSandbox(time_limit=2.0, allow_unisolated=True)
    assert "local sandbox running WITHOUT: bubblewrap" in caplog.text
    assert box.run_python({"main.py": RESULT.format(value="7")}, "main.py").result == 7
    assert box.run_python({"main.py": "while True:\n    pass"}, "main.py").status == "timeout"


def test_repository_commands_use_python_env_even_under_tmp(tmp_path):
    """A workspace runs commands with its ``python_env`` first on PATH, also where the environment
    lives under the host's /tmp (the sandbox's own /tmp is private and must not hide it)."""
    if LocalSandbox(time_limit=10).missing_layers():
        pytest.skip("repository workspaces need every isolation layer")
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    checkout = tmp_path / "repo"
    checkout.mkdir()
    subprocess.run(["git", "-C", str(checkout), "init", "-q"], check=True)
    sandbox = LocalSandbox(time_limit=20, python_env=str(env))
    with sandbox.workspace(checkout) as ws:
        result = ws.run("python -c 'import sys; print(sys.prefix)'; pwd; touch /tmp/x && echo tmp-writable")
        assert result.stdout.split() == [str(env), "/testbed", "tmp-writable"]
        ws.run("ln -s /etc/passwd leak")
        with pytest.raises(PropelError, match="leak is a symbolic link"):
            ws.read("leak")
    with pytest.raises(PropelError, match="has no bin/python"):
        LocalSandbox(python_env=str(tmp_path))
