"""The built-in executors: ``local`` (jobs in threads on this machine, model turns batched) and ``ray``
(jobs as Ray tasks on a cluster, scheduled where a sandbox can run)."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from propel_core import Job, JobRunner, PropelError, hookimpl


@hookimpl
def register_executors(register):
    register("local", LocalExecutor)
    register("ray", RayExecutor)


class Stopped(PropelError):
    """The run is stopping (an error elsewhere, or Ctrl-C); the job asking for the model ends here."""


class TurnBatcher:
    """Gathers the model turns of concurrent jobs into one ``generate`` call, as a serving engine would.

    A job's request waits until every running job is waiting for the model too, or ``linger`` seconds
    have passed since the first waiting request (a job busy in its sandbox is not waited for longer).
    Each request keeps its own seeds, so batching never changes a completion. ``calls`` counts the
    backend calls made.
    """

    def __init__(self, generate, linger: float = 0.05):
        self.generate, self.linger = generate, linger
        self.cond = threading.Condition()
        self.pending: list[tuple[tuple, Future]] = []
        self.active, self.calls, self.closed = 0, 0, False
        self.thread = threading.Thread(target=self._serve, name="propel-turns", daemon=True)
        self.thread.start()

    def __call__(self, prompts, sampling, n=1, seed=None) -> list[list[str]]:
        future: Future = Future()
        with self.cond:
            if self.closed:
                raise Stopped("the run is stopping")
            self.pending.append(((prompts, sampling, n, seed), future))
            self.cond.notify_all()
        return future.result()

    def job_started(self) -> None:
        with self.cond:
            self.active += 1

    def job_finished(self) -> None:
        with self.cond:
            self.active -= 1
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.thread.join()

    def _serve(self) -> None:
        while True:
            with self.cond:
                while not self.pending and not self.closed:
                    self.cond.wait()
                deadline = time.monotonic() + self.linger
                while not self.closed and len(self.pending) < self.active and time.monotonic() < deadline:
                    self.cond.wait(deadline - time.monotonic())
                batch, self.pending = self.pending, []
                if self.closed:
                    for _, future in batch:
                        future.set_exception(Stopped("the run is stopping"))
                    return
            self._answer(batch)

    def _answer(self, batch: list[tuple[tuple, Future]]) -> None:
        """One backend call per kind of request (same sampling and n), seeds per prompt."""
        groups: dict[str, list[tuple[tuple, Future]]] = {}
        for request in batch:
            (_, sampling, n, _), _ = request
            groups.setdefault(f"{n}:{sampling.model_dump_json()}", []).append(request)
        for requests in groups.values():
            prompts = [prompt for (prompts, *_), _ in requests for prompt in prompts]
            seeds = [seed for (prompts, _, _, seeds), _ in requests for seed in _seeds(seeds, len(prompts))]
            (_, sampling, n, _), _ = requests[0]
            try:
                self.calls += 1
                completions = self.generate(prompts, sampling, n=n, seed=seeds)
            except BaseException as exc:  # the jobs that asked get the error; the batcher keeps serving
                for _, future in requests:
                    future.set_exception(exc)
                continue
            for (prompts_of_request, *_), future in requests:
                future.set_result(completions[: len(prompts_of_request)])
                completions = completions[len(prompts_of_request) :]


def _seeds(seed, count: int) -> list[int | None]:
    return list(seed) if isinstance(seed, list) else [seed] * count


class LocalExecutor:
    """``workers`` jobs at once in threads of this process, each with its own sandbox or workspace.
    Model turns of concurrent jobs go to the model as one batched call (an in-process model) or as
    concurrent requests (a served model through the ``openai`` backend)."""

    def __init__(self, workers: int = 8, linger: float = 0.05, torch_threads: int | None = None):
        self.workers, self.linger, self.in_flight = workers, linger, 0
        self.torch_threads = torch_threads
        self.generate_calls = 0

    def run(self, worker: JobRunner, jobs: list[Job]) -> Iterator[tuple[Job, Any]]:
        with torch_threads(self.torch_threads or chosen_threads(self.workers)):
            yield from self._run(worker, jobs)

    def _run(self, worker: JobRunner, jobs: list[Job]) -> Iterator[tuple[Job, Any]]:
        batcher = TurnBatcher(worker.generate, self.linger)

        def one(job: Job):
            batcher.job_started()
            try:
                return worker.run(job, generate=batcher)
            finally:
                batcher.job_finished()

        pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="propel-job")
        running: dict[Future, Job] = {}
        try:
            for job, future in keep_busy(
                self,
                jobs,
                running,
                lambda job: pool.submit(one, job),
                lambda futures: wait(futures, return_when=FIRST_COMPLETED)[0],
            ):
                yield job, future.result()
        finally:
            self.in_flight = 0
            batcher.close()  # jobs still running stop at their next model turn
            pool.shutdown(wait=True, cancel_futures=True)
            self.generate_calls += batcher.calls


#: environment variables by which the user has chosen torch's thread count: the executor keeps it
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def available_cores() -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup v2 CPU quota (a container's
    ``--cpus``), which ``os.cpu_count()`` does not see."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return cores
    return cores if quota == "max" else max(1, min(cores, int(quota) // int(period)))


def busy_threads(samples: int = 5, interval: float = 0.01) -> int:
    """How many threads of the machine, but the one asking, are running or waiting for a core now: the
    kernel's count of runnable tasks (``procs_running`` in /proc/stat) less the asker, the median of
    ``samples`` readings ``interval`` seconds apart (0 where /proc has no such count). This process's
    other busy threads count: an audit generating beside a training, a grader beside the model."""
    readings = []
    for sample in range(samples):
        if sample:
            time.sleep(interval)
        try:
            stat = Path("/proc/stat").read_text().splitlines()
            readings.append(int(next(line for line in stat if line.startswith("procs_running")).split()[1]))
        except (OSError, StopIteration, ValueError):
            return 0
    return max(0, sorted(readings)[len(readings) // 2] - 1)


def chosen_threads(workers: int) -> int | None:
    """Torch's intra-op threads while ``workers`` jobs run in threads of this process: the model's calls
    come from one thread (the turn batcher), and each other job may keep a core busy grading (a
    sandbox, a test suite), so the model gets the cores those and other threads leave, at least one:
    ``cores - workers + 1 - busy``, where ``busy`` counts the other threads running now, this
    process's and other processes' (:func:`busy_threads`); a training asks with one worker, itself,
    at every step. None (torch's own count kept) where the user set ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS``. With a
    thread per core, the model, the graders and any other process on the machine fight over the
    cores, and torch's threads wait for each other at every operation (docs/scaling.md)."""
    if any(os.environ.get(name) for name in THREAD_VARIABLES):
        return None
    return max(1, available_cores() - workers + 1 - busy_threads())


@contextlib.contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Torch's intra-op thread count set to ``count`` (None: left alone) for the block, then put back."""
    if count is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def keep_busy(executor, jobs: list[Job], running: dict, start, finished) -> Iterator[tuple[Job, Any]]:
    """Start jobs in order while fewer than ``executor.workers`` run (``start(job)`` -> a handle, kept
    in ``running``); yield each job with its handle once ``finished(handles)`` names it done."""
    queue = list(reversed(jobs))
    while queue or running:
        while queue and len(running) < executor.workers:
            job = queue.pop()
            running[start(job)] = job
        executor.in_flight = len(running)
        for handle in finished(list(running)):
            job = running.pop(handle)
            executor.in_flight = len(running)
            yield job, handle


def _listing(resources: dict[str, float]) -> str:
    return ", ".join(f"{name}: {amount:g}" for name, amount in sorted(resources.items()) if "." not in name)


_WORKERS: dict[str, JobRunner] = {}


def _run_job(worker: JobRunner, job: Job):
    """A Ray task: one job, with this process's cached copy of the worker (domain, backend)."""
    cached = _WORKERS.setdefault(worker.key(), worker)
    return cached.run(job)


#: Ray's switch for a cluster of one machine: off, a local instance takes loopback as its node address
#: and its servers listen there only (by default they listen on every interface)
LOCAL_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
#: the first Ray that starts a local instance with token authentication on
AUTHENTICATING_RAY = (2, 59)


def _check_local_ray(ray) -> None:
    """Refuse to start a local Ray instance that would accept unauthenticated jobs."""
    version = tuple(int(part) for part in ray.__version__.split(".")[:2] if part.isdigit())
    if version < AUTHENTICATING_RAY:
        raise PropelError(
            f"Ray {ray.__version__} starts a local instance without token authentication (an open job API); "
            "pip install 'ray>=2.59', or give executor.options.address of a cluster you secured"
        )
    if os.environ.get("RAY_AUTH_MODE", "token") != "token":
        raise PropelError(
            f"RAY_AUTH_MODE={os.environ['RAY_AUTH_MODE']} would start a local Ray that runs anyone's jobs; unset it"
        )


class RayExecutor:
    """Jobs as Ray tasks on the cluster at ``address`` (or ``RAY_ADDRESS``; neither: a new Ray instance
    started on this machine, on loopback). A job is scheduled only where ``resources`` are free (say ``{docker: 1}``,
    declared per node with ``ray start --resources``); a job lost with its worker or node is retried
    by Ray up to ``max_retries`` times, with the same seed. An error raised by a job stops the run."""

    def __init__(
        self,
        workers: int = 8,
        address: str | None = None,
        resources: dict[str, float] | None = None,
        num_cpus: float = 1,
        max_retries: int = 3,
    ):
        address = address or os.environ.get("RAY_ADDRESS") or "local"  # "local": a new instance here
        local = address == "local"  # never one a `ray start` left running (address: auto joins that)
        if local:  # read when Ray is imported: a local instance then lives on loopback
            os.environ[LOCAL_ONLY] = "0"
        try:
            import ray
        except ImportError:
            raise PropelError("the ray executor needs Ray: pip install 'propel-core[ray]'") from None
        self.ray, self.workers, self.in_flight = ray, workers, 0
        if not ray.is_initialized():
            if local:
                _check_local_ray(ray)
            ray.init(address=address, include_dashboard=False, ignore_reinit_error=True, logging_level="warning")
            if local and not ipaddress.ip_address(ray.util.get_node_ip_address()).is_loopback:
                ray.shutdown()  # Ray was imported before LOCAL_ONLY was set
                raise PropelError(
                    f"a local Ray would listen on {ray.util.get_node_ip_address()}, beyond loopback: set "
                    f"{LOCAL_ONLY}=0 before Ray is imported, or give executor.options.address"
                )
        options = dict(num_cpus=num_cpus, resources=dict(resources or {}), max_retries=max_retries)
        self.remote = ray.remote(_run_job).options(**options, retry_exceptions=False)
        needed = {"CPU": num_cpus, **(resources or {})}
        available = ray.cluster_resources()
        missing = [name for name, amount in needed.items() if available.get(name, 0) < amount]
        if missing:
            raise PropelError(
                f"no node of the Ray cluster offers {', '.join(f'{name}: {needed[name]}' for name in missing)} "
                f"(cluster resources: {_listing(available)}); "
                "declare them with `ray start --resources`, or change executor.options"
            )

    def run(self, worker: JobRunner, jobs: list[Job]) -> Iterator[tuple[Job, Any]]:
        ray = self.ray
        shipped = ray.put(worker)
        running: dict[Any, Job] = {}
        try:
            for job, ref in keep_busy(
                self,
                jobs,
                running,
                lambda job: self.remote.remote(shipped, job),
                lambda refs: ray.wait(refs, num_returns=1)[0],
            ):
                yield job, ray.get(ref)
        finally:
            self.in_flight = 0
            for ref in running:
                ray.cancel(ref, force=True)
