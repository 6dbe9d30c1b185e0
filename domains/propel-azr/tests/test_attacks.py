"""Hostile programs against the AZR validity predicates and the solver grader, in the real sandbox.

Each attack is run three ways: as the generator's function through ``azr_execution`` alone (the
sandbox is the only defence), through the full validity chain (the static filter too), and as a
solver's answer through the grader. After every run: no sandbox process survives, nothing outside
the workdir changed, the harness's secrets did not leak, and the harness returned in bounded time.
"""

import base64
import json
import os
import socket
import time

import pytest

from propel_core.domain import make_task
from propel_core.records import Context, Task, Validity
from propel_core.testing import sandbox_folders_left, stray_sandbox_processes

TIME_LIMIT = 2.0
SECRET = "propel-secret-canary-value"


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """Things on the host a program must not touch: a canary file and a listening socket."""
    folder = tmp_path_factory.mktemp("host")
    os.chmod(folder, 0o777)  # even a world-writable folder must stay out of reach
    canary = folder / "canary.txt"
    canary.write_text("untouched")
    os.chmod(canary, 0o666)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.1)
    yield {"folder": folder, "canary": canary, "port": server.getsockname()[1], "server": server}
    server.close()


@pytest.fixture(scope="module")
def domain():
    from propel_core.plugins import Registry

    registry = Registry.build()
    if registry.get("sandboxes", "local")(time_limit=TIME_LIMIT).missing_layers():
        pytest.skip("the attack suite needs bubblewrap and root (run scripts/setup.sh as root)")
    return registry.domain("azr", sandbox_options={"time_limit": TIME_LIMIT, "memory_mb": 256})


ENCODED_OS = base64.b64encode(b"__import__('os').system('touch {folder}/pwned')").decode()

# Attacks that only try to escape: the sandbox alone must contain them, but it may well find the
# function itself deterministic and valid; the static filter rejects them (test_full_validity_chain).
CONTAINED = "contained"

# name -> (code defining f, what the execution predicate must say: a reason prefix, None for any
# rejection, or CONTAINED)
ATTACKS = {
    "fork_bomb": ("import os\ndef f(x):\n    while True:\n        os.fork()\n", None),
    "memory_bomb_module": ("blob = bytearray(10 ** 10)\ndef f(x):\n    return x\n", "oom"),
    "memory_bomb_call": ("def f(x):\n    return [0] * (10 ** 10)\n", "f raised MemoryError"),
    "infinite_loop": ("def f(x):\n    while True:\n        pass\n", "timeout"),
    "sleep_forever": ("import time\ndef f(x):\n    time.sleep(10 ** 6)\n", "timeout"),
    "stdout_flood_1gb": (
        "import sys\ndef f(x):\n    chunk = 'x' * (1 << 16)\n    for _ in range(1 << 14):\n"
        "        sys.stdout.write(chunk)\n",
        "output_limit",
    ),
    "write_outside_workdir": ("def f(x):\n    open('{folder}/written.txt', 'w').write('x')\n    return x\n", None),
    "delete_outside_workdir": ("import os\ndef f(x):\n    os.remove('{canary}')\n    return x\n", None),
    "write_to_system": ("def f(x):\n    open('/usr/lib/propel-evil', 'w').write('x')\n    return x\n", None),
    "network_connect": (
        "import socket\ndef f(x):\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n    return x\n",
        "f raised",
    ),
    "read_parent_environment": (
        "import os\ndef f(x):\n    found = open('/proc/1/environ', 'rb').read().decode(errors='replace')\n"
        "    return [found, dict(os.environ), x]\n",
        None,
    ),
    "ignore_signals": (
        "import signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
        "    signal.signal(s, signal.SIG_IGN)\ndef f(x):\n    while True:\n        pass\n",
        "timeout",
    ),
    "setsid_double_fork": (
        "import os, time\ndef f(x):\n    if os.fork() == 0:\n        os.setsid()\n        if os.fork() == 0:\n"
        "            while True:\n                open('alive', 'a').write('.')\n                time.sleep(0.05)\n"
        "        os._exit(0)\n    return x\n",
        CONTAINED,
    ),
    "deep_recursion": (
        "import sys\nsys.setrecursionlimit(10 ** 8)\ndef g(n):\n    return g(n + 1) + 1\ndef f(x):\n    return g(0)\n",
        None,
    ),
    "exit_before_result": ("import os\nos._exit(0)\ndef f(x):\n    return x\n", "no_result"),
    "malicious_eq": (
        "class Sly(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
        "def f(x):\n    return Sly(x)\n",
        "f raised TypeError",
    ),
    "malicious_repr": (
        "class Loud:\n    def __repr__(self):\n        while True:\n            pass\ndef f(x):\n    return Loud()\n",
        "f raised TypeError",
    ),
    "import_via_dunder_import": (
        "def f(x):\n    __import__('os').system('touch {folder}/pwned')\n    return x\n",
        CONTAINED,
    ),
    "import_via_importlib": (
        "import importlib\ndef f(x):\n    importlib.import_module('subprocess').run(['touch', '{folder}/pwned'])\n"
        "    return x\n",
        CONTAINED,
    ),
    "import_via_getattr": (
        "def f(x):\n    load = getattr(__builtins__, '__imp' + 'ort__')\n"
        "    load('os').system('touch {folder}/pwned')\n    return x\n",
        CONTAINED,
    ),
    "eval_of_encoded_string": (
        "import base64\ndef f(x):\n    eval(base64.b64decode('" + ENCODED_OS + "'))\n    return x\n",
        CONTAINED,
    ),
    "nondeterminism_hash_order": ("def f(x):\n    return list({{'alpha', 'beta', 'gamma', 'delta', str(x)}})\n", None),
    "nondeterminism_time": ("import time\ndef f(x):\n    return time.time_ns() % 1000 + x\n", "nondeterministic"),
    "nondeterminism_random": ("import random\ndef f(x):\n    return random.random() + x\n", "nondeterministic"),
    "file_size_bomb": ("def f(x):\n    open('big', 'wb').write(b'0' * (64 << 20))\n    return x\n", None),
    "huge_integer_output": ("def f(x):\n    return 10 ** 100000\n", None),
    "disk_flood_many_big_files": (
        "def f(x):\n    for i in range(1000):\n        open('big%d' % i, 'wb').write(b'0' * (8 << 20))\n    return x\n",
        None,
    ),
    "inode_flood": (
        "def f(x):\n    for i in range(100000):\n        open('n%d' % i, 'w').close()\n    return x\n",
        None,
    ),
    "outlive_the_timeout": (
        "import os\ndef f(x):\n    if os.fork() == 0:\n        os.setsid()\n        i = 0\n        while True:\n"
        "            open('late%d' % (i % 50), 'w').write('x')\n            i += 1\n    while True:\n        pass\n",
        None,
    ),
    "forged_result_nan": (
        "import json, os\ndef f(x):\n    open('result.json', 'w').write('{{\"outputs\": [{{\"value\": NaN}}]}}')\n"
        "    os._exit(0)\n",
        None,
    ),
    "forged_result_overflow": (
        "import os\ndef f(x):\n    open('result.json', 'w').write('{{\"outputs\": [{{\"value\": 1e999}}]}}')\n"
        "    os._exit(0)\n",
        None,
    ),
}


def sandbox_processes() -> list[str]:
    """Processes of any uid the sandbox hands out (a range of its own, one uid per run) that outlived
    a run of this test session."""
    from propel_plugins.sandbox import LocalSandbox

    return stray_sandbox_processes(LocalSandbox(time_limit=1).uids)


def assert_contained(host, started: float, *texts: str) -> None:
    time.sleep(0.2)  # let the kernel finish tearing down the pid namespace
    assert sandbox_processes() == []
    assert sandbox_folders_left() == []
    assert sorted(p.name for p in host["folder"].iterdir()) == ["canary.txt"]
    assert host["canary"].read_text() == "untouched"
    with pytest.raises(TimeoutError):
        host["server"].accept()  # nothing connected
    assert all(SECRET not in text for text in texts)
    assert time.monotonic() - started < 3 * TIME_LIMIT + 10


def code_for(name: str, host) -> str:
    return ATTACKS[name][0].format(folder=host["folder"], canary=host["canary"], port=host["port"])


def task_for(code: str) -> Task:
    payload = {"code": code, "inputs": [[i] for i in range(10)], "message": "hint"}
    return Task(
        id="a", domain="azr", context_id="c", generation="", payload=payload, validity=Validity.ok(), generator="m"
    )


def test_at_least_twenty_attacks():
    assert len(ATTACKS) >= 20


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_execution_predicate_contains_attack(name, domain, host, monkeypatch):
    monkeypatch.setenv("PROPEL_TEST_SECRET", SECRET)
    from propel_azr.plugin import check_execution

    started = time.monotonic()
    task = task_for(code_for(name, host))
    validity = check_execution(task, domain)
    expected = ATTACKS[name][1]
    if expected != CONTAINED:
        assert not validity.valid, f"{name} was accepted"
    if expected not in (None, CONTAINED):
        assert validity.reason.startswith(expected), validity.reason
    assert_contained(host, started, validity.reason or "", json.dumps(task.payload))


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_full_validity_chain_rejects_attack(name, domain, host):
    from propel_core.plugins import Registry

    registry = Registry.build()
    predicates = {p: registry.get("validity_predicates", p) for p in domain.validity_predicates}
    code = code_for(name, host)
    inputs = "\n".join(json.dumps([i]) for i in range(10))
    generation = f"<code>\n{code}\n</code>\n<inputs>\n{inputs}\n</inputs>\n<message>hint</message>"
    started = time.monotonic()
    task = make_task("a", domain, Context(id="c", data={}), generation, "m", predicates)
    assert not task.validity.valid
    assert_contained(host, started)


@pytest.fixture(scope="module")
def real_task(domain):
    """A valid task from a seed: f(xs) = max(xs) - min(xs)."""
    from propel_azr.plugin import check_execution

    task = task_for("def f(xs):\n    return max(xs) - min(xs) if xs else 0\n")
    task.payload["inputs"] = [[[i, i * i % 7, 3]] for i in range(10)]
    assert check_execution(task, domain).valid
    return task


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_grader_fails_attack(name, domain, host, real_task, monkeypatch):
    monkeypatch.setenv("PROPEL_TEST_SECRET", SECRET)
    started = time.monotonic()
    verdict = domain.grade(real_task.payload, f"Here you go:\n```python\n{code_for(name, host)}```")
    assert verdict.solved is False, (verdict.solved, verdict.reason)
    assert verdict.diagnostics["sandbox_status"] != "sandbox_error"
    assert_contained(host, started, verdict.reason or "")
