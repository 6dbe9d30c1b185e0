"""How the execution layer scales, measured in one run on this machine (say how many cores it has).

Four comparisons, each on realistic work through the same code the stages use (``propel_core.execution``):

1. sandbox-bound: SWE solver attempts on the tiny test repository (a scripted solver runs the suite,
   then submits; each attempt is graded on a clean checkout) with the local executor at 1, 2 and 4
   workers: attempts per second and parallel efficiency against 1 worker;
2. in-process model: 8 SWE solver episodes by the embedded model (3 turns at most), its turns batched
   across episodes (8 workers) vs one episode at a time (1 worker); the peer is plain one-at-a-time
   Hugging Face generation, as the label stage ran before;
3. served model: labeling arithmetic tasks through ``transformers serve`` (the PyPI server, the
   embedded model), 1 vs 8 requests in flight;
4. Ray: procedural SWE bugs (mutation + verification in the sandbox) on a 2-node Ray cluster started
   here vs the local executor, both with 4 workers in all.

Arms are interleaved, each repeated (``--repeats``) after a warm-up; min and median are printed, and
ratios come from the medians of this run.

    python benchmarks/label_scaling.py [--repeats 3] [--skip served,ray]
"""

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from propel_core import hookimpl
from propel_core.config import DomainConfig, ModelConfig, Sampling, validate_config
from propel_core.domain import make_task
from propel_core.embedded import cache_dir
from propel_core.execution import Attempt, Episode, Worker, job_seed, task_id
from propel_core.plugins import Registry, get_plugin_manager
from propel_core.run import Run
from propel_core.testing import serving_embedded_model
from propel_plugins.executors import LocalExecutor
from propel_swe.checkout import git_checkout, python_environment

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "domains" / "propel-swe" / "tests" / "data" / "tinystats"


class Scripted:
    """A solver that runs the test suite once, then submits (no model)."""

    model_id = "scripted"

    def __init__(self, model):
        self.config = model

    def generate(self, prompts, sampling, n=1, seed=None):
        return [["```bash\npython -m pytest -q\n```" if len(p) <= 2 else "```submit\n```"] * n for p in prompts]


class ScriptedPlugin:
    @staticmethod
    @hookimpl
    def register_model_backends(register):
        register("scripted", Scripted)


def timed(action) -> float:
    started = time.monotonic()
    action()
    return time.monotonic() - started


def report(name: str, times: list[float], work: int, unit: str) -> float:
    median = statistics.median(times)
    print(f"  {name:38s} min {min(times):7.2f} s  median {median:7.2f} s  ({work / median:6.2f} {unit}/s)")
    return median


def swe_options(folder: Path) -> dict:
    repo = git_checkout(Path(shutil.copytree(TINY, folder / "tinystats")))
    env = python_environment(cache_dir() / "swe" / "test-env", ["pytest"])
    (folder / "repos.yaml").write_text(yaml.safe_dump({"repos": [{"name": "tinystats", "path": str(repo)}]}))
    return {"registry": str(folder / "repos.yaml"), "preflight_dir": str(folder / "preflight"),
            "generator": "procedural", "solver_max_turns": 3, "solver_budget": 300,
            "sandbox_options": {"time_limit": 60, "memory_mb": 2048, "max_processes": 64,
                                "python_env": str(env)}}  # fmt: skip


def valid_bugs(registry, options: dict, count: int):
    domain = registry.domain("swe", **options)
    worker = Worker(DomainConfig(name="swe", options=options), ModelConfig(), Sampling(), registry, domain)
    context = domain.contexts()[0]
    episodes = [Episode(task_id(i), context, job_seed(0, task_id(i))) for i in range(4 * count)]
    tasks = sorted((task for _, task in LocalExecutor(2).run(worker, episodes) if task.validity.valid),
                   key=lambda task: task.id)  # fmt: skip
    return domain, tasks[:count]


def attempts_of(tasks, k: int):
    return [Attempt(task, j, job_seed(0, task.id, j)) for task in tasks for j in range(k)]


def sandbox_bound(registry, options, domain, tasks, repeats: int) -> None:
    print(f"1. sandbox-bound: {len(tasks) * 2} scripted SWE solver attempts (suite run + grading), local executor")
    worker = Worker(DomainConfig(name="swe", options=options), ModelConfig(backend="scripted"), Sampling(),
                    registry, domain)  # fmt: skip
    jobs = attempts_of(tasks, 2)
    times: dict[int, list[float]] = {1: [], 2: [], 4: []}
    list(LocalExecutor(2).run(worker, jobs[:2]))  # warm-up
    for _ in range(repeats):
        for workers in times:
            times[workers].append(timed(lambda workers=workers: list(LocalExecutor(workers).run(worker, jobs))))
    medians = {w: report(f"{w} worker(s)", t, len(jobs), "attempts") for w, t in times.items()}
    for w in (2, 4):
        speedup = medians[1] / medians[w]
        print(f"  {w} workers vs 1: {speedup:.2f}x, parallel efficiency {speedup / w:.0%} (on {os.cpu_count()} cores)")


def in_process(registry, options, domain, tasks, repeats: int) -> None:
    print("2. in-process model: 8 SWE solver episodes by the embedded model (3 turns, 32 tokens a turn)")
    worker = Worker(DomainConfig(name="swe", options=options), ModelConfig(batch_size=8),
                    Sampling(temperature=0.7, top_p=0.95, max_new_tokens=32), registry, domain)  # fmt: skip
    jobs = attempts_of(tasks, 8 // len(tasks))[:8]
    list(LocalExecutor(8).run(worker, jobs[:2]))  # warm-up: loads the model
    times: dict[str, list[float]] = {"one at a time (1 worker)": [], "batched turns (8 workers)": []}
    calls: dict[str, int] = {}
    for _ in range(repeats):
        for name, workers in (("one at a time (1 worker)", 1), ("batched turns (8 workers)", 8)):
            executor = LocalExecutor(workers)
            times[name].append(timed(lambda executor=executor: list(executor.run(worker, jobs))))
            calls[name] = executor.generate_calls
    medians = {name: report(f"{name}, {calls[name]} calls", t, len(jobs), "episodes") for name, t in times.items()}
    one, batched = medians.values()
    print(f"  batched vs one at a time: {one / batched:.2f}x (target >= 3x)")


def served(tmp: Path, repeats: int) -> None:
    print("3. served model: labeling arithmetic tasks through `transformers serve` (embedded model)")
    with serving_embedded_model() as (url, model):
        solver = {"backend": "openai", "model": model, "base_url": url,
                  "server_extensions": False, "max_concurrency": 8,
                  "sampling": {"temperature": 0.6, "top_p": 0.95, "max_new_tokens": 16}}  # fmt: skip
        registry = Registry.build()
        run = Run(validate_config({"run_dir": str(tmp / "served"), "domain": {"name": "arithmetic"},
                                   "solver": solver}, registry), registry, quiet=True)  # fmt: skip
        domain = run.domain()
        worker = Worker(run.config.domain, run.config.solver, run.config.solver.sampling, registry, domain)
        contexts = domain.contexts()
        predicates = {name: registry.get("validity_predicates", name) for name in domain.validity_predicates}
        tasks = [make_task(f"a{i}", domain, contexts[i % len(contexts)], f"Compute: {i + 3} + {2 * i}", "hand",
                           predicates) for i in range(8)]  # fmt: skip
        jobs = attempts_of(tasks, 4)
        list(LocalExecutor(8).run(worker, jobs[:8]))  # warm-up
        times: dict[int, list[float]] = {1: [], 8: []}
        for _ in range(repeats):
            for workers in times:
                times[workers].append(timed(lambda workers=workers: list(LocalExecutor(workers).run(worker, jobs))))
        medians = {w: report(f"{w} request(s) in flight", t, len(jobs), "attempts") for w, t in times.items()}
        print(f"  8 in flight vs 1: {medians[1] / medians[8]:.2f}x")


def ray_overhead(registry, options, repeats: int) -> None:
    print("4. Ray: 12 procedural SWE bugs (mutation + verification), 4 workers in all")
    import ray
    from ray.cluster_utils import Cluster

    from propel_plugins.executors import RayExecutor

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, logging_level="warning")
    try:
        domain = registry.domain("swe", **options)
        worker = Worker(DomainConfig(name="swe", options=options), ModelConfig(), Sampling(), registry, domain)
        context = domain.contexts()[0]
        jobs = [Episode(task_id(i), context, job_seed(7, task_id(i))) for i in range(12)]
        executors = {"local, 4 workers": LocalExecutor(4), "ray, 2 nodes x 2 workers": RayExecutor(4)}
        for executor in executors.values():  # warm-up: Ray starts its worker processes
            list(executor.run(worker, jobs[:4]))
        times: dict[str, list[float]] = {name: [] for name in executors}
        for _ in range(repeats):
            for name, executor in executors.items():
                times[name].append(timed(lambda executor=executor: list(executor.run(worker, jobs))))
        local, on_ray = (report(name, t, len(jobs), "episodes") for name, t in times.items())
        print(f"  ray vs local: {on_ray / local:.2f}x the time, overhead {on_ray / local - 1:+.0%} (target <= +20%)")
    finally:
        ray.shutdown()
        cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip", default="", help="comma-separated: sandbox, model, served, ray")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    print(f"this machine: {os.cpu_count()} cores")
    manager = get_plugin_manager()
    manager.register(ScriptedPlugin, name="scripted")
    registry = Registry.build(manager)
    with tempfile.TemporaryDirectory() as tmp:
        options = swe_options(Path(tmp))
        domain, tasks = valid_bugs(registry, options, 4)
        if "sandbox" not in skip:
            sandbox_bound(registry, options, domain, tasks, args.repeats)
        if "model" not in skip:
            in_process(registry, options, domain, tasks, args.repeats)
        if "served" not in skip:
            served(Path(tmp), args.repeats)
        if "ray" not in skip:
            ray_overhead(registry, options, args.repeats)


if __name__ == "__main__":
    main()
