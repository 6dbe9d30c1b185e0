"""Hostile programs against the sandbox's clock (``propel_core.clock.RunClock``): a program must not be
able to make itself ungradable (``sandbox_error``, ``overloaded``), run past its time limit unjudged,
get a verdict that moves with the machine's load, or make the harness raise or hang.

Each test asserts the safe outcome. Three were holes when the attacker wrote them, closed since: a run
that lowered its own scheduling weight starved itself into "overloaded" (each run now has a CPU share
of its own, and a run that slowed itself is timeout at the backstop), and a sleeper that timed the
readings through its output was never seen idle (the readings now fall on the harness's own timer).
"""

import contextlib
import os
import subprocess
import sys
import time

import pytest

from propel_core.testing import cpu_hogs
from propel_plugins.sandbox import LocalSandbox

LIMIT = 0.5
#: what an attack that did nothing worse than ``timeout`` may take, in wall-clock seconds: a few times
#: the limit (its own time reaches the limit), with room for a shared machine's start-up delays
SOON = 8 * LIMIT + 4

SPIN = "while True:\n    pass\n"
#: lower the whole run's scheduling weight every way an unprivileged process may: its session's
#: autogroup to nice 19 (/proc/self/autogroup is writable by its owner; with autogroups the session,
#: not the thread, is what competes with other sessions), the thread's nice to 19 and SCHED_IDLE (what
#: counts where the kernel has no autogroups)
STARVE_ME = (
    "import os\n"
    "try:\n"
    "    with open('/proc/self/autogroup', 'w') as group:\n"
    "        group.write('19')\n"
    "except OSError:\n"
    "    pass\n"
    "os.nice(19)\n"
    "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
)
#: the CPU the one hog of the light load runs on, and the run pins itself to
CPU = min(os.sched_getaffinity(0))
#: and, to need no more than one busy CPU, it pins itself to the hog's
STARVE_ME += f"os.sched_setaffinity(0, {{{CPU}}})\n"

#: hostile programs that must end ``timeout`` within SOON seconds, idle and beside the hogs
TIMEOUTS = {
    # sleeping in slices shorter than the readings, so that a reading may catch it awake
    "sleeps in 1 ms slices": "import time\nwhile True:\n    time.sleep(0.001)\n",
    # a thundering herd: threads woken together every 2 ms, runnable in bursts, asleep between them
    "a herd of threads woken every 2 ms": (
        "import threading, time\nthreading.stack_size(65536)\ncondition = threading.Condition()\n"
        "def wait():\n    while True:\n        with condition:\n            condition.wait()\n"
        "for _ in range(6):\n    threading.Thread(target=wait, daemon=True).start()\n"
        "while True:\n    time.sleep(0.002)\n    with condition:\n        condition.notify_all()\n"
    ),
    # blocked for ever on a pipe nobody writes
    "blocks on an empty pipe": "import os\nread, write = os.pipe()\nos.read(read, 1)\n",
    # a child process sleeps while the parent waits for it (posix_spawn: vfork in the C library)
    "waits on a spawned sleeper": "import os\nos.posix_spawn('/bin/sleep', ['sleep', '100'], {})\nos.wait()\n",
}

#: hostile programs that must end ``timeout`` within SOON seconds on the machine as it is
IDLE_TIMEOUTS = TIMEOUTS | {
    # stops itself with SIGSTOP; a child wakes it and it spins
    "stops itself, woken by its child": (
        "import os, signal, time\nif os.fork() == 0:\n    time.sleep(0.2)\n    os.kill(os.getppid(), signal.SIGCONT)\n"
        "    time.sleep(100)\nos.kill(os.getpid(), signal.SIGSTOP)\n" + SPIN
    ),
    "spins on sched_yield": "import os\nwhile True:\n    os.sched_yield()\n",
    "a spinner under SCHED_BATCH": "import os\nos.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))\n" + SPIN,
    # threads started and joined without end: tids are reused, the readings miss most of them
    "churns threads": (
        "import threading\nthreading.stack_size(65536)\nwhile True:\n"
        "    threads = [threading.Thread(target=lambda: None) for _ in range(8)]\n"
        "    [thread.start() for thread in threads]\n    [thread.join() for thread in threads]\n"
    ),
    # children forked, computing a little and exiting faster than the readings
    "forks short-lived children": (
        "import os\nwhile True:\n    child = os.fork()\n    if child == 0:\n        sum(range(20000))\n"
        "        os._exit(0)\n    os.waitpid(child, 0)\n"
    ),
    # closes its output pipes (the harness then waits on the process) and sleeps, then spins
    "closes stdout and stderr and sleeps": "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(100)\n",
    "closes stdout and stderr and spins": "import os\nos.close(1)\nos.close(2)\n" + SPIN,
}


@contextlib.contextmanager
def one_hog():
    """A light load: one CPU-bound process, in a session of its own, on CPU ``CPU`` only."""
    hog = subprocess.Popen(
        [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{CPU}}})\nwhile True:\n    pass\n"],
        start_new_session=True,
    )
    try:
        time.sleep(0.2)  # running, pinned
        yield hog
    finally:
        hog.kill()
        hog.wait()


@pytest.fixture(scope="module")
def sandbox():
    box = LocalSandbox(time_limit=LIMIT, memory_mb=256, backstop=12)
    if box.missing_layers():
        pytest.skip(f"needs: {box.missing_layers()}")
    return box


def timed(sandbox, code: str):
    started = time.monotonic()
    result = sandbox.run_python({"main.py": code}, "main.py")
    return result, time.monotonic() - started


@pytest.mark.parametrize("name", list(IDLE_TIMEOUTS))
def test_hostile_program_is_a_timeout_soon_on_the_machine_as_it_is(sandbox, name):
    result, wall = timed(sandbox, IDLE_TIMEOUTS[name])
    assert (result.status, wall < SOON) == ("timeout", True), (name, result.status, result.detail, wall)


def test_hostile_programs_are_timeouts_soon_beside_16_hogs(sandbox):
    """Load must not turn a sleeper's idle time into time waited (a run never judged), nor make it
    ``overloaded``: its stretches asleep are still idle, and it ends ``timeout`` as it does idle."""
    with cpu_hogs(per_core=8):
        outcomes = {name: timed(sandbox, code) for name, code in TIMEOUTS.items()}
    wrong = {name: (r.status, r.detail, round(wall, 1)) for name, (r, wall) in outcomes.items()}
    wrong = {name: got for name, got in wrong.items() if got[0] != "timeout" or got[2] >= SOON}
    assert not wrong


def test_a_run_pinned_to_a_busy_cpu_at_its_own_weight_is_a_timeout(sandbox):
    """Pinning itself to the one busy CPU, weight untouched, the run still gets its share of that CPU:
    its CPU time reaches the limit, ``timeout``, never ``overloaded``. (The backstop is raised so that
    the shared machine's own load on that CPU cannot reach it.)"""
    box = LocalSandbox(time_limit=LIMIT, memory_mb=256, backstop=40)
    with one_hog():
        result, wall = timed(box, f"import os\nos.sched_setaffinity(0, {{{CPU}}})\n" + SPIN)
    assert result.status == "timeout", (result.status, result.detail, wall)


#: a sleeper that chooses the moments of the readings: each write to stdout wakes the harness, which
#: takes a reading (when one is due) right after reading the pipe; the program spins from its write
#: until the harness has read it (FIONREAD on its stdout) and 2 ms more, then sleeps 36 ms (less than
#: the harness's 50 ms select timeout, so the harness never wakes, nor reads, on its own)
DISGUISED_SLEEPER = """import fcntl, os, struct, termios, time
def unread():
    return struct.unpack("i", fcntl.ioctl(1, termios.FIONREAD, bytes(4)))[0]
end = time.monotonic() + 1.5
while time.monotonic() < end:
    os.write(1, b".")
    while unread():
        pass
    awake = time.monotonic() + 0.002
    while time.monotonic() < awake:
        pass
    time.sleep(0.036)
open("result.json", "w").write("1")
"""


def test_a_sleeper_cannot_time_the_readings_through_its_output(sandbox):
    """Asleep 90% of 1.5 s, three times its limit: its own time passes the limit, so it is ``timeout``.
    Tried three times; one ``ok`` is the hole (a reading that lands while it sleeps can still catch it)."""
    results = [sandbox.run_python({"main.py": DISGUISED_SLEEPER}, "main.py") for _ in range(3)]
    assert [result.status for result in results] == ["timeout"] * 3, [
        (result.status, result.cpu_seconds, result.duration) for result in results
    ]


def test_a_run_that_starves_itself_beside_light_load_is_not_overloaded():
    """One hog on one CPU (a light load, far below a training's) and a program that pins itself to
    that CPU and spins at the lowest weight it can give itself: it waits for a CPU nearly all the
    time, by its own choice, while the other CPUs may be idle."""
    box = LocalSandbox(time_limit=LIMIT, memory_mb=256, backstop=10)
    if box.missing_layers():
        pytest.skip(f"needs: {box.missing_layers()}")
    with one_hog():
        result = box.run_python({"main.py": STARVE_ME + SPIN}, "main.py")
    assert result.status != "sandbox_error", result.detail


def test_an_azr_answer_cannot_make_itself_ungradable_beside_light_load(azr_reference):
    domain, payload = azr_reference
    # the model does not know f: rather than answer wrong (reward 0) it makes the attempt ungradable
    starve = "".join(f"    {line}\n" for line in STARVE_ME.splitlines())
    answer = f"def f(xs):\n{starve}    while True:\n        pass\n"
    with one_hog():
        verdict = domain.grade(payload, f"```python\n{answer}```")
    assert verdict.solved is False, (verdict.solved, verdict.reason)
