"""The local sandbox: result statuses, isolation facts, and failing closed."""

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from propel_core.errors import PropelError
from propel_core.testing import (
    MEMORY_PINNERS,
    assert_same_verdicts_under_load,
    cpu_hogs,
    sandbox_folders_left,
    stray_sandbox_processes,
)
from propel_plugins.sandbox import STATUSES, LocalSandbox, SandboxUnavailable, plain_json


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
    assert one["uid"] in sandbox.uids and (one["gid"], one["groups"]) == (one["uid"], [])
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
        ws.run("ln -s /etc/passwd leak; mkfifo pipe /propel-out/pipe")
        with pytest.raises(PropelError, match="leak is a symbolic link"):
            ws.read("leak")
        for path in ("pipe", "/propel-out/pipe"):  # a FIFO would block the harness forever
            with pytest.raises(PropelError, match="is not a regular file"):
                ws.read(path)
            with pytest.raises(PropelError, match="is not a regular file"):
                ws.write(path, b"x")
    with pytest.raises(PropelError, match="has no bin/python"):
        LocalSandbox(python_env=str(tmp_path))


@pytest.mark.parametrize(
    ("code", "detail"),
    [
        ("for i in range(100):\n    open('f%d' % i, 'wb').write(b'0' * (8 << 20))", "MiB are used up"),
        ("for i in range(100000):\n    open('n%d' % i, 'w').close()", "files are used up"),
    ],
)
def test_a_full_workdir_is_its_own_status_and_the_host_is_untouched(sandbox, code, detail):
    before = shutil.disk_usage(tempfile.gettempdir()).used
    result = run(sandbox, code)
    assert (result.status, detail in (result.detail or "")) == ("disk_limit", True), (result.status, result.detail)
    # the flood is 800 MiB or 100,000 files; other processes (a second test worker) may write a little
    assert abs(shutil.disk_usage(tempfile.gettempdir()).used - before) < 200 << 20
    assert sandbox_folders_left() == []


def test_nothing_outlives_a_run(sandbox):
    """A child that leaves the session and keeps writing after its parent timed out: the run ends
    with every process of its uid gone, then its folder is removed; nothing raises."""
    code = (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    i = 0\n    while True:\n"
        "        open('late%d' % (i % 20), 'w').write('x' * 4096)\n        i += 1\nwhile True:\n    pass\n"
    )
    for _ in range(3):
        assert run(sandbox, code).status == "timeout"
    assert sandbox_folders_left() == []
    assert stray_sandbox_processes(sandbox.uids) == []


def test_a_process_left_under_a_sandbox_uid_is_found(sandbox):
    """What the check above counts on: a process of a sandbox uid in no run's group is a stray, seen
    in both of the check's looks; once it is gone, nothing is."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to start a process under a sandbox uid")
    uid = sandbox.uids[-1]
    left = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "30"])
    try:
        time.sleep(0.3)
        found = stray_sandbox_processes(sandbox.uids)
        assert [line.split()[:2] for line in found] == [[str(uid), str(left.pid)]], found
    finally:
        left.kill()
        left.wait()
    assert stray_sandbox_processes(sandbox.uids) == []


def test_concurrent_runs_have_their_own_uid_and_process_budget(sandbox):
    """One run exhausting its process limit leaves the others theirs."""
    bomb = "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.05)\n"
    spawn = (
        "import json, os, subprocess, time\ntime.sleep(0.5)\n"
        "kids = [subprocess.Popen(['/bin/sleep', '0.2']) for _ in range(8)]\n"
        "[k.wait() for k in kids]\njson.dump(os.getuid(), open('result.json', 'w'))\n"
    )
    with ThreadPoolExecutor(3) as pool:
        bombs = pool.submit(run, sandbox, bomb)
        spawned = list(pool.map(lambda _: run(sandbox, spawn), range(2)))
    assert bombs.result().status == "timeout"
    assert [r.status for r in spawned] == ["ok", "ok"], [r.detail for r in spawned]
    assert len({r.result for r in spawned}) == 2 and all(r.result in sandbox.uids for r in spawned)


@pytest.mark.parametrize(
    "text",
    ['{"v": NaN}', '{"v": Infinity}', "[-Infinity]", "[1e999]", '{"a": 1, "a": 2}', '["\\ud800"]'],
)
def test_result_must_round_trip(sandbox, text):
    code = f"open('result.json', 'w').write({text!r})"
    result = run(sandbox, code)
    assert result.status == "no_result" and "not plain JSON" in result.detail
    with pytest.raises(ValueError):
        plain_json(text.encode())


def test_plain_json_keeps_plain_data():
    data = {"a": [1, -0.5, 1e300, "é", None, True], "b": {}}
    assert plain_json(json.dumps(data).encode()) == data


@pytest.mark.parametrize("name", MEMORY_PINNERS)
def test_the_memory_bound_counts_what_address_space_limits_miss(sandbox, name):
    bound = (sandbox.memory_bytes + sandbox.disk_bytes) >> 20
    result = run(sandbox, MEMORY_PINNERS[name], time_limit=20)
    assert result.status in ("ok", "oom", "error"), (result.status, result.detail, result.stderr[-300:])
    pinned = result.result if result.status == "ok" else None
    assert pinned is None or pinned <= bound, f"{name}: {pinned} MiB pinned under a bound of {bound} MiB"
    if name == "a tmpfs in a new user namespace":
        assert result.status == "ok" and pinned == 0  # the namespace is refused outright


def test_user_namespaces_and_sysv_ipc_are_refused_or_tiny(sandbox):
    code = (
        "import ctypes, json, os, subprocess\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "facts = {'unshare': libc.unshare(0x10000000), 'errno': ctypes.get_errno(),\n"
        "         'big_segment': libc.shmget(0, 2 << 20, 0o1600), 'small_segment': libc.shmget(0, 256 << 10, 0o1600),\n"
        "         'shmmax': open('/proc/sys/kernel/shmmax').read().strip(),\n"
        "         'fork': subprocess.run(['/bin/true']).returncode}\n"
        "json.dump(facts, open('result.json', 'w'))\n"
    )
    facts = run(sandbox, code).result
    assert (facts["unshare"], facts["errno"]) == (-1, 1)  # EPERM
    assert facts["big_segment"] == -1 and facts["small_segment"] >= 0
    assert facts["shmmax"] == "1048576" and facts["fork"] == 0
    assert int(Path("/proc/sys/kernel/shmmax").read_text()) > 1 << 20  # the host's own is untouched


def test_runs_leave_no_cgroup_behind(sandbox):
    from propel_plugins import bounds

    for code in ("while True:\n    pass", RESULT.format(value="1")):
        run(sandbox, code, time_limit=0.5)
    found = bounds.hierarchy()
    left = [
        path.name for folder in {found.memory, found.pids} for path in folder.glob(f"{bounds.PREFIX}{os.getpid()}-*")
    ]
    assert left == []


def test_refuses_without_a_memory_cgroup(monkeypatch):
    from propel_plugins import bounds

    monkeypatch.setattr(bounds, "hierarchy", lambda: "no cgroup hierarchy with a memory controller is mounted")
    with pytest.raises(SandboxUnavailable, match=r"missing: a memory cgroup per run \(no cgroup hierarchy"):
        LocalSandbox()


def test_repository_commands_have_the_same_memory_bound(tmp_path):
    box = LocalSandbox(time_limit=20, memory_mb=256, disk_mb=64)
    if box.missing_layers():
        pytest.skip(f"needs: {box.missing_layers()}")
    bound = (box.memory_bytes + box.disk_bytes) >> 20
    with box.workspace(tmp_path) as ws:
        for name, program in MEMORY_PINNERS.items():
            ws.write("pin.py", program.encode())
            result = ws.run("rm -f result.json; python -S pin.py")
            assert result.status in ("ok", "oom", "error"), (name, result.status, result.stderr[-300:])
            if result.status == "ok":
                assert json.loads(ws.read("result.json")) <= bound, name


def test_a_folder_chain_of_any_depth_is_cleaned_up(sandbox, tmp_path):
    """A chain of folders far deeper than a recursive walk or PATH_MAX allows, left in a command's
    /tmp and in the checkout: the next command starts with an empty /tmp, and closing removes all."""
    build = "import os\nfor _ in range(1500):\n    os.mkdir('d' * 12)\n    os.chdir('d' * 12)\nprint('built')"
    chain = f"python -S -c {shlex.quote(build)}"  # 19,500 characters deep
    # where the environment itself lives under the host's /tmp (a clone there), its mount point shows
    mounted = {
        Path(prefix).relative_to("/tmp").parts[0]
        for prefix in (
            str(sandbox.python_env),
            os.path.realpath(Path(os.path.realpath(sandbox.interpreter)).parents[1]),
        )
        if Path(prefix).is_relative_to("/tmp")
    }
    with sandbox.workspace(tmp_path) as ws:
        assert ws.run(f"cd /tmp && {chain}", time_limit=60).stdout == "built\n"
        assert set(ws.run("ls -A /tmp").stdout.split()) == mounted
        assert ws.run(chain, time_limit=60).stdout == "built\n"
    assert sandbox_folders_left() == []
    unisolated = tmp_path / "plain"
    unisolated.mkdir()
    from propel_plugins.sandbox import remove_tree

    subprocess.run(["bash", "-c", chain], cwd=unisolated, check=True, capture_output=True)
    remove_tree(unisolated)
    assert not unisolated.exists()


BURN = "import os, time\ndef burn(s):\n    t = time.process_time()\n    while time.process_time() - t < s: pass\n"
#: programs near, under and past a 1 s limit, and the status each must get on any machine
NEAR_THE_LIMIT = {
    "computes within its limit": (BURN + "burn(0.6)\n" + RESULT.format(value=1), "ok"),
    "sleeps, then computes, within its limit": (BURN + "time.sleep(0.3)\nburn(0.3)\n" + RESULT.format(value=1), "ok"),
    "children compute within its limit": (
        BURN + "pids = [os.fork() or (burn(0.25), os._exit(0)) for _ in range(2)]\n"
        "[os.waitpid(p, 0) for p in pids]\n" + RESULT.format(value=1),
        "ok",
    ),
    "an endless loop": ("while True:\n    pass\n", "timeout"),
    "a sleeper": ("import time\ntime.sleep(1000)\n", "timeout"),
    "a child it waits for computes past the limit": (
        BURN + "pid = os.fork() or (burn(1.5), os._exit(0))\nos.waitpid(pid, 0)\n" + RESULT.format(value=1),
        "timeout",
    ),
    "four processes compute past the limit together": (
        BURN + "pids = [os.fork() or (burn(0.4), os._exit(0)) for _ in range(4)]\n"
        "[os.waitpid(p, 0) for p in pids]\n" + RESULT.format(value=1),
        "timeout",
    ),
}


def test_verdicts_on_time_are_the_same_idle_and_at_8x_oversubscription():
    """Each program gets its status from the CPU and own time it used, so sixteen CPU hogs beside it
    on two cores (in a session of their own) slow it, and change no verdict. The backstop is
    raised so that the test's own load (another test worker beside it) cannot reach it."""
    box = LocalSandbox(time_limit=1.0, memory_mb=256, backstop=60)
    if box.missing_layers():
        pytest.skip(f"needs: {box.missing_layers()}")
    verdicts = assert_same_verdicts_under_load(
        lambda code: run(box, code).status, {name: code for name, (code, _) in NEAR_THE_LIMIT.items()}
    )
    assert verdicts == {name: status for name, (_, status) in NEAR_THE_LIMIT.items()}


def test_a_run_the_backstop_stops_is_overloaded_not_timed_out():
    """A run that queues for a CPU until the wall-clock backstop has used little of its limit: it ends
    sandbox_error (overloaded, with its clocks), never timeout; a sleeper is timeout at its limit."""
    box = LocalSandbox(time_limit=1.0, memory_mb=256, backstop=2)
    if box.missing_layers():
        pytest.skip(f"needs: {box.missing_layers()}")
    with cpu_hogs(per_core=16, own_sessions=True):  # starved for real, the run queues past the backstop
        queued = run(box, BURN + "burn(0.9)\n" + RESULT.format(value=1))
        sleeper = run(box, "import time\ntime.sleep(1000)\n")
    assert queued.status == "sandbox_error" and queued.detail.startswith("overloaded: the machine was too busy")
    assert queued.cpu_seconds < 0.9 and queued.wait_seconds > 1 and 2 <= queued.duration < 4, queued
    assert sleeper.status == "timeout" and "over its time limit" in sleeper.detail and sleeper.duration < 2, sleeper
