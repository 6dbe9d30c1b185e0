"""A second attacker's hostile programs against the sandbox's clock (``propel_core.clock.RunClock``),
beside those of ``tests/test_clock_attacks.py`` (which this file does not repeat).

Three classes, each test asserting the safe outcome:

1. forge ``overloaded`` (``sandbox_error``: the attempt ungradable, paid its group's mean reward) on
   a machine with no load but the test's own: contention among the run's own threads (``waited`` is
   summed over threads), wake-up chains, EEVDF slices, I/O priority, D state, page-fault storms,
   slowed children that vanish between readings, a harness kept busy by one-byte writes;
2. escape the limit (run far longer than the limit and not be ``timeout``);
3. misjudge an honest program (a false ``timeout``, or ``timeout`` where the machine was too busy).

An attack that succeeds is marked ``xfail(strict=True)`` with the hole in its reason: the test turns
red once the hole is closed, so that the mark is removed with it. Two holes found here are closed (an
honest run pinning one thread per CPU counted as slowed; the sandbox's set-up counted as idle); one
is left, written down in docs/sandbox.md: a sleep hidden behind a spinning thread on a busy machine.
"""

import time

import pytest

from propel_core.testing import cpu_hogs
from propel_plugins.sandbox import LocalSandbox

LIMIT = 0.5
#: a forged ``overloaded`` needs the backstop; 8x the limit keeps each attempt under 4 s
BACKSTOP = 8
#: what a run that ends ``timeout`` on its CPU or own time may take, in wall-clock seconds
SOON = 8 * LIMIT + 4

SPIN = "while True:\n    pass\n"
THREADS = "import threading\nthreading.stack_size(65536)\n"
#: an honest unit of work that does not read the clock (a coarse process clock cannot stretch it)
WORK = "def work(n):\n    x = 0\n    for i in range(n):\n        x += i\n    return x\n"
RESULT = "open('result.json', 'w').write('1')\n"

#: class 1: programs that try to wait for a CPU without using one, on a machine with no other load
FORGERIES = {
    # waited is a sum over threads, compared with one wall clock: 12 spinners wait 5x what they use
    "twelve spinning threads": THREADS
    + "for _ in range(12):\n    threading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True).start()\n"
    + SPIN,
    # a token passed round a ring of processes: one is always runnable or in a cross-CPU wake-up
    "a ring of eight processes passing a byte": (
        "import os\nN = 8\npipes = [os.pipe() for _ in range(N)]\ni = 0\nfor k in range(1, N):\n"
        "    if os.fork() == 0:\n        i = k\n        break\n"
        "r, w = pipes[i][0], pipes[(i + 1) % N][1]\nif i == 0:\n    os.write(w, b'x')\n"
        "while True:\n    os.read(r, 1)\n    os.write(w, b'x')\n"
    ),
    # sched_setattr(SCHED_NORMAL, nice 0, a 100 us EEVDF slice) and the idle I/O class: neither is a
    # nice, a policy or an affinity the readings look at
    "a 100 us EEVDF slice and the idle I/O class": (
        "import ctypes, struct\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.syscall(251, 1, 0, 3 << 13)\n"
        "attr = ctypes.create_string_buffer(struct.pack('IIQiIQQQ', 56, 0, 0, 0, 0, 100000, 0, 0))\n"
        "libc.syscall(314, 0, attr, 0)\n" + THREADS + "for _ in range(8):\n"
        "    threading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True).start()\n" + SPIN
    ),
    # children that slow themselves (nice 19, SCHED_IDLE), wait behind the parent and exit within
    # 2 ms, mostly between two readings: the threads change from one reading to the next
    "slowed children that vanish between readings": (
        "import os\nwhile True:\n    try:\n        child = os.fork()\n    except BlockingIOError:\n"
        "        os.waitpid(-1, 0)\n        continue\n    if child == 0:\n        os.nice(19)\n"
        "        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
        "        sum(range(20000))\n        os._exit(0)\n    sum(range(2000))\n"
    ),
    # a parent in D state (vfork) while its child spins, again and again
    "a vfork parent in D state beside spinners": (
        "import os\n" + THREADS + "for _ in range(4):\n"
        "    threading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True).start()\n"
        "while True:\n    os.waitpid(os.posix_spawn('/bin/sh', ['sh', '-c', 'i=0; while [ $i -lt 3000 ]; do "
        "i=$((i+1)); done'], {}), 0)\n"
    ),
    # page faults without end: map, touch every page, unmap (system time in the run's own context)
    "a page-fault storm": (
        "import mmap\nwhile True:\n    m = mmap.mmap(-1, 16 << 20)\n"
        "    for offset in range(0, 16 << 20, 4096):\n        m[offset] = 1\n    m.close()\n"
    ),
    # the harness kept busy: a byte at a time on stdout (one wake-up and one read each) while
    # twelve threads spin and wait for the CPUs the harness holds
    "one-byte writes beside twelve spinners": THREADS
    + "import os\nfor _ in range(12):\n"
    + "    threading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True).start()\n"
    + "while True:\n    os.write(1, b'.')\n",
    # children stopped and continued by their parent: runnable between a SIGCONT and the next SIGSTOP
    "children stopped and continued in turn": (
        "import os, signal\nkids = []\nfor _ in range(6):\n    pid = os.fork()\n    if pid == 0:\n"
        "        while True:\n            pass\n    kids.append(pid)\n"
        "while True:\n    for pid in kids:\n        os.kill(pid, signal.SIGSTOP)\n"
        "    for pid in kids:\n        os.kill(pid, signal.SIGCONT)\n"
    ),
    # the largest timer slack, 12 threads sleeping in 1 ms slices: woken late, all at once
    "twelve sleepers with a one-second timer slack": (
        "import ctypes, time\nctypes.CDLL(None).prctl(29, 10**9)\n" + THREADS + "def nap():\n"
        "    while True:\n        time.sleep(0.001)\n"
        "for _ in range(12):\n    threading.Thread(target=nap, daemon=True).start()\nnap()\n"
    ),
}


@pytest.fixture(scope="module")
def sandbox():
    box = LocalSandbox(time_limit=LIMIT, memory_mb=256, backstop=BACKSTOP)
    if box.missing_layers():
        pytest.skip(f"needs: {box.missing_layers()}")
    return box


def timed(box: LocalSandbox, code: str):
    started = time.monotonic()
    result = box.run_python({"main.py": code}, "main.py")
    return result, time.monotonic() - started


@pytest.mark.parametrize("name", list(FORGERIES))
def test_a_program_cannot_forge_overloaded(sandbox, name):
    """On a machine with no load but the test's, each is ``timeout`` (its CPU time or own time reaches
    the limit) long before the backstop, never ``sandbox_error``."""
    result, wall = timed(sandbox, FORGERIES[name])
    assert (result.status, wall < SOON) == ("timeout", True), (name, result.status, result.detail, wall)


def test_an_azr_answer_with_many_spinning_threads_is_not_ungradable(azr_reference):
    """AZR's grader: an answer that spins in twelve threads (``waited`` summed over them is five times
    their CPU time) is a failure, not an ungradable attempt."""
    domain, payload = azr_reference
    answer = (
        "def f(xs):\n    import threading\n    threading.stack_size(65536)\n    for _ in range(12):\n"
        "        threading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True).start()\n"
        "    while True:\n        pass\n"
    )
    verdict = domain.grade(payload, f"```python\n{answer}```")
    assert verdict.solved is False, (verdict.solved, verdict.reason)


# -- class 2: escaping the limit -----------------------------------------------------------------------

#: a program that sleeps 2 s (four times its limit) while one thread of it spins: its own time
#: on a machine of its own is 2.5 s. On a busy machine the spinner is runnable at every reading, so
#: no stretch is idle, and it gets so little CPU that its CPU time stays under the limit
HIDDEN_SLEEP = (
    THREADS + "threading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True).start()\n"
    "import time\ntime.sleep(2.0)\n" + RESULT
)


def test_a_sleeper_is_timeout_on_the_machine_as_it_is(sandbox):
    """The control: with no load, the spinner's CPU time reaches the limit first."""
    result, wall = timed(sandbox, HIDDEN_SLEEP)
    assert (result.status, wall < SOON) == ("timeout", True), (result.status, result.detail, wall)


@pytest.mark.xfail(
    strict=True,
    reason=(
        "hole: a sleep hidden behind one spinning thread counts neither as idle (a thread was runnable "
        "at every reading) nor as CPU time (the spinner waited for a CPU): on a busy machine the run "
        "sleeps 4x its limit and is ok, on an idle one it is timeout"
    ),
)
def test_a_sleep_hidden_behind_a_spinner_is_timeout_on_a_busy_machine():
    box = LocalSandbox(time_limit=LIMIT, memory_mb=256, backstop=20)
    if box.missing_layers():
        pytest.skip(f"needs: {box.missing_layers()}")
    with cpu_hogs(per_core=12, own_sessions=True):
        result, wall = timed(box, HIDDEN_SLEEP)
    assert result.status == "timeout", (result.status, result.detail, result.cpu_seconds, wall)


#: the same sleep hidden behind a spinner that lowered itself (SCHED_IDLE) and pinned itself to the
#: one busy CPU of a light load: slowed, so the backstop would be timeout, but it ends before it
HIDDEN_SLEEP_SLOWED = (
    THREADS + "import os\ndef spin():\n    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
    "    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n" + "    while True:\n        pass\n"
    "threading.Thread(target=spin, daemon=True).start()\nimport time\ntime.sleep(2.0)\n" + RESULT
)


def test_a_sleep_hidden_behind_a_slowed_spinner_is_timeout_beside_light_load():
    """One hog pinned to the first CPU: the run's CPU share of its own still gives the spinner its
    half of that CPU, so its CPU time reaches the limit long before the sleep ends."""
    import os
    import subprocess
    import sys

    box = LocalSandbox(time_limit=LIMIT, memory_mb=256, backstop=20)
    if box.missing_layers():
        pytest.skip(f"needs: {box.missing_layers()}")
    cpu = min(os.sched_getaffinity(0))
    hog = subprocess.Popen(
        [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True:\n    pass\n"],
        start_new_session=True,
    )
    try:
        time.sleep(0.2)
        result, wall = timed(box, HIDDEN_SLEEP_SLOWED)
    finally:
        hog.kill()
        hog.wait()
    assert (result.status, wall < SOON) == ("timeout", True), (result.status, result.detail, result.cpu_seconds, wall)


#: children that stop themselves and are continued by a sibling: stopped threads are not runnable,
#: so the stretches count as idle and it is timeout; a stopped thread must not pass for a waiting one
STOPPED = (
    "import os, signal, time\nkids = []\nfor _ in range(4):\n    pid = os.fork()\n    if pid == 0:\n"
    "        while True:\n            os.kill(os.getpid(), signal.SIGSTOP)\n    kids.append(pid)\n"
    "while True:\n    time.sleep(0.01)\n    for pid in kids:\n        os.kill(pid, signal.SIGCONT)\n"
)


def test_stopped_children_are_not_a_way_out(sandbox):
    result, wall = timed(sandbox, STOPPED)
    assert (result.status, wall < SOON) == ("timeout", True), (result.status, result.detail, wall)


# -- class 3: honest programs ---------------------------------------------------------------------------

#: 0.2 s of CPU in two threads, then a result: honest, well under the limit
HONEST = WORK + THREADS + "threads = [threading.Thread(target=work, args=(2 * 10**6,)) for _ in range(2)]\n"
HONEST += "[t.start() for t in threads]\n[t.join() for t in threads]\n" + RESULT
#: 960 KB of output (under the 1 MiB cap) in 1 KB lines, then the same work
CHATTY = "import sys\nfor _ in range(960):\n    sys.stdout.write('x' * 1023 + '\\n')\n    sys.stdout.flush()\n"
CHATTY = WORK + CHATTY + "work(2 * 10**6)\n" + RESULT


@pytest.mark.parametrize("code", [HONEST, CHATTY], ids=["two threads", "960 KB of output"])
def test_an_honest_program_is_ok_on_a_busy_machine(code):
    """Beside sixteen sessions of hogs the honest programs queue for the CPU (their waiting is not
    theirs) and, blocked on a full pipe, for the harness to read it: neither may be their timeout."""
    box = LocalSandbox(time_limit=LIMIT, memory_mb=256, backstop=20)
    if box.missing_layers():
        pytest.skip(f"needs: {box.missing_layers()}")
    assert timed(box, code)[0].status == "ok"
    with cpu_hogs(per_core=8, own_sessions=True):
        result, wall = timed(box, code)
    assert result.status == "ok", (result.status, result.detail, result.cpu_seconds, wall)


#: honest work in two threads, each pinned to a CPU of its own (what OMP_PROC_BIND, taskset per
#: worker, or a benchmark's pinning does): together they may use every CPU the run was given
PINNED = WORK + THREADS + "import os\ncpus = sorted(os.sched_getaffinity(0))\ndef pinned(k):\n"
PINNED += "    os.sched_setaffinity(0, {cpus[k % len(cpus)]})\n    work(10**8)\n"
PINNED += "threads = [threading.Thread(target=pinned, args=(k,)) for k in range(2)]\n"
PINNED += "[t.start() for t in threads]\n[t.join() for t in threads]\n"
#: the same work, unpinned: the control
UNPINNED = PINNED.replace("    os.sched_setaffinity(0, {cpus[k % len(cpus)]})\n", "")


def test_an_honest_run_pinning_a_thread_per_cpu_is_overloaded_on_a_machine_too_busy():
    box = LocalSandbox(time_limit=LIMIT, memory_mb=256, backstop=2)
    if box.missing_layers():
        pytest.skip(f"needs: {box.missing_layers()}")
    with cpu_hogs(per_core=8, own_sessions=True):
        control = box.run_python({"main.py": UNPINNED}, "main.py")
        result = box.run_python({"main.py": PINNED}, "main.py")
    if control.status != "sandbox_error":
        pytest.skip(f"the load did not reach the backstop: the control was {control.status}")
    assert result.status == "sandbox_error", (result.status, result.detail)


#: a program that never sleeps, blocks or waits: none of its own time can be idle
NEVER_IDLE = RESULT


def test_the_sandboxs_set_up_is_not_the_programs_idle_time(monkeypatch):
    import propel_plugins.sandbox as sandbox_module
    from propel_core.clock import RunClock

    clocks = []

    class Recorded(RunClock):
        def __post_init__(self):
            clocks.append(self)

    monkeypatch.setattr(sandbox_module, "RunClock", Recorded)
    box = LocalSandbox(time_limit=LIMIT, memory_mb=256, backstop=20)
    if box.missing_layers():
        pytest.skip(f"needs: {box.missing_layers()}")
    with cpu_hogs(per_core=8, own_sessions=True):
        statuses = [box.run_python({"main.py": NEVER_IDLE}, "main.py").status for _ in range(20)]
    assert statuses == ["ok"] * 20, statuses
    idle = [round(clock.idle, 3) for clock in clocks if clock.idle]
    assert not idle, idle
