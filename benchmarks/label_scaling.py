"""How the execution layer scales, measured in one run on this machine (say how many cores it has).

Four comparisons, each on realistic work through the same code the stages use (``propel_core.execution``):

1. sandbox-bound: SWE solver attempts on the tiny test repository (a scripted solver runs the suite,
   then submits; each attempt is graded on a clean checkout) with the local executor at 1, 2 and 4
   workers: attempts per second and parallel efficiency against 1 worker;
2. in-process model: 8 SWE solver episodes by the embedded model (3 turns at most), its turns batched
   across episodes (8 workers) vs one episode at a time (1 worker); the peer is plain one-at-a-time
   Hugging Face generation, as the label stage ran before;
3. served model: labeling arithmetic tasks (written by the embedded generator, the demo config's
   settings) through ``transformers serve`` (the PyPI server, the embedded model), 1 vs 8 requests in
   flight;
4. Ray: procedural SWE bugs (mutation + verification in the sandbox) on a 2-node Ray cluster started
   here vs the local executor, both with 4 workers in all.

Arms are interleaved with rotation (timing.compare), each repeated (``--repeats``) after a warm-up
round; min and median are printed with the spread, and ratios from both, all from one run. Model
budgets are small (32 and 16 new tokens) so a run takes minutes on 2 CPU cores; each part says so.

    python benchmarks/label_scaling.py [--repeats 3] [--skip served,ray]
"""

import argparse
import os
import shutil
import tempfile
from pathlib import Path

import psutil
import yaml
from timing import compare, ratio, report

from propel_core import hookimpl
from propel_core.config import DomainConfig, ModelConfig, Sampling
from propel_core.contracts import Attempt, Episode
from propel_core.embedded import cache_dir
from propel_core.execution import job_seed, sample_tasks, task_id
from propel_core.plans import load_config, validate_config
from propel_core.plugins import Registry, get_plugin_manager
from propel_core.run import Run
from propel_core.testing import serving_embedded_model
from propel_core.worker import Worker
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


def autogroup(pid: int) -> str:
    """The scheduler autogroup (one CPU share per session) a process runs in."""
    try:
        return Path(f"/proc/{pid}/autogroup").read_text().split()[0]
    except OSError:
        return "?"


def executor_arm(worker, jobs, workers: int, calls: dict | None = None, name: str = ""):
    """One call: all ``jobs`` through a fresh local executor with ``workers`` in flight."""

    def run() -> None:
        executor = LocalExecutor(workers)
        list(executor.run(worker, jobs))
        if calls is not None:
            calls[name] = executor.generate_calls

    return run


def swe_options(folder: Path) -> dict:
    repo = git_checkout(Path(shutil.copytree(TINY, folder / "tinystats")))
    env = python_environment(cache_dir() / "swe" / "test-env", ["pytest"])
    (folder / "repos.yaml").write_text(yaml.safe_dump({"repos": [{"name": "tinystats", "path": str(repo)}]}))
    return {
        "registry": str(folder / "repos.yaml"),
        "preflight_dir": str(folder / "preflight"),
        "generator": "procedural",
        "solver_max_turns": 3,
        "solver_budget": 300,
        "sandbox_options": {"time_limit": 60, "memory_mb": 2048, "max_processes": 64, "python_env": str(env)},
    }


def valid_bugs(registry, options: dict, count: int):
    domain = registry.domain("swe", **options)
    worker = Worker(DomainConfig(name="swe", options=options), ModelConfig(), Sampling(), registry, domain)
    contexts = domain.episode_contexts([domain.contexts()[0]] * 4 * count, 0)  # mutants 0, 1, ... as a run numbers them
    episodes = [Episode(task_id(i), context, job_seed(0, task_id(i))) for i, context in enumerate(contexts)]
    tasks = sorted(
        (task for _, task in LocalExecutor(2).run(worker, episodes) if task.validity.valid), key=lambda task: task.id
    )
    return domain, tasks[:count]


def attempts_of(tasks, k: int):
    return [Attempt(task, j, job_seed(0, task.id, j)) for task in tasks for j in range(k)]


def sandbox_bound(registry, options, domain, tasks, repeats: int) -> None:
    worker = Worker(
        DomainConfig(name="swe", options=options), ModelConfig(backend="scripted"), Sampling(), registry, domain
    )
    jobs = attempts_of(tasks, 2)
    arms = {f"{w} worker(s)": executor_arm(worker, jobs, w) for w in (1, 2, 4)}
    times = compare(arms, repeats=repeats, warmup=1)
    report(
        f"1. sandbox-bound: {len(jobs)} scripted SWE solver attempts (suite run + grading), local executor at "
        "1, 2 and 4 workers",
        times,
        baseline="1 worker(s)",
        per=(len(jobs), "attempts"),
    )
    for w in (2, 4):
        low, mid = ratio(times, "1 worker(s)", f"{w} worker(s)")
        print(
            f"  {w} workers vs 1: {low:.2f}x (min), {mid:.2f}x (median); parallel efficiency {mid / w:.0%} "
            f"(median, on {os.cpu_count()} cores)"
        )


def in_process(registry, options, domain, tasks, repeats: int) -> None:
    # 32 new tokens a turn, not the solver's default 1,024: 8 episodes x 3 turns at 1,024 tokens would take
    # most of an hour a repeat on 2 CPU cores; batching pays per step, so the ratio holds at any length
    worker = Worker(
        DomainConfig(name="swe", options=options),
        ModelConfig(batch_size=8),
        Sampling(temperature=0.7, top_p=0.95, max_new_tokens=32),
        registry,
        domain,
    )
    jobs = attempts_of(tasks, 8 // len(tasks))[:8]
    one, batched = "one at a time, 1 worker (peer: plain one-at-a-time HF generation)", "batched turns, 8 workers"
    calls: dict[str, int] = {}
    arms = {one: executor_arm(worker, jobs, 1, calls, one), batched: executor_arm(worker, jobs, 8, calls, batched)}
    times = compare(arms, repeats=repeats, warmup=1)  # the warm-up round loads the model
    report(
        f"2. in-process model: {len(jobs)} SWE solver episodes by the embedded model (3 turns at most, 32 new "
        "tokens a turn)",
        times,
        baseline=one,
        per=(len(jobs), "episodes"),
    )
    low, mid = ratio(times, one, batched)
    print(f"  generate calls: {calls}; batched vs one at a time: {low:.2f}x (min), {mid:.2f}x (median) (target >= 3x)")


def served(tmp: Path, repeats: int) -> None:
    # the demo config's arithmetic tasks, written by the embedded generator through the generate code,
    # and its solver sampling (16 new tokens): the quick start's label stage, served
    demo = load_config(
        ROOT / "propel_core" / "configs" / "demo.yaml", [f"run_dir={tmp / 'written'}", "generate.num_tasks=32"]
    )
    writer = Run(demo, Registry.build(), quiet=True)
    contexts = writer.context_sampler(demo.seed).sample(demo.generate.num_tasks)
    written = sample_tasks(writer.services, demo.generator, contexts, writer.dir / "tasks.jsonl", demo.seed)
    tasks = [task for task in written if task.validity.valid][:8]
    print(f"  ({len(tasks)} valid of {len(written)} arithmetic tasks written by the embedded generator)")
    with serving_embedded_model() as (url, model):
        solver = {
            "backend": "openai",
            "model": model,
            "base_url": url,
            "server_extensions": False,
            "max_concurrency": 8,
            "sampling": demo.solver.sampling.model_dump(),
        }
        registry = Registry.build()
        run = Run(
            validate_config(
                {"run_dir": str(tmp / "served"), "domain": {"name": "arithmetic"}, "solver": solver}, registry
            ),
            registry,
            quiet=True,
        )
        domain = run.domain()
        worker = Worker(run.config.domain, run.config.solver, run.config.solver.sampling, registry, domain)
        jobs = attempts_of(tasks, 4)
        arms = {f"{w} request(s) in flight": executor_arm(worker, jobs, w) for w in (1, 8)}
        times = compare(arms, repeats=repeats, warmup=1)
        what = f"3. served model: {len(jobs)} arithmetic attempts (16 new tokens) through `transformers serve`"
        report(
            f"{what}, 1 vs 8 requests in flight", times, baseline="1 request(s) in flight", per=(len(jobs), "attempts")
        )
        low, mid = ratio(times, "1 request(s) in flight", "8 request(s) in flight")
        print(f"  8 in flight vs 1: {low:.2f}x (min), {mid:.2f}x (median)")


def ray_overhead(registry, options, repeats: int) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from propel_plugins.executors import RayExecutor

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, logging_level="warning")
    try:
        domain = registry.domain("swe", **options)
        worker = Worker(DomainConfig(name="swe", options=options), ModelConfig(), Sampling(), registry, domain)
        contexts = domain.episode_contexts([domain.contexts()[0]] * 12, 7)
        jobs = [Episode(task_id(i), context, job_seed(7, task_id(i))) for i, context in enumerate(contexts)]
        local, on_ray = "local executor, 4 workers", "ray, 2 nodes x 2 workers"
        executors = {local: LocalExecutor(4), on_ray: RayExecutor(4)}
        arms = {
            name: (lambda executor=executor: list(executor.run(worker, jobs))) for name, executor in executors.items()
        }
        times = compare(arms, repeats=repeats, warmup=1)  # the warm-up round starts Ray's worker processes
        print(
            f"  autogroups (CPU shares): this process {autogroup(os.getpid())}, Ray's processes "
            f"{sorted({autogroup(p.pid) for p in psutil.Process().children(recursive=True)})}"
        )
        report(
            f"4. Ray: {len(jobs)} procedural SWE bugs (mutation + verification), 4 workers in all",
            times,
            baseline=local,
            per=(len(jobs), "episodes"),
        )
        low, mid = ratio(times, on_ray, local)
        print(
            f"  ray vs local: {low:.2f}x (min), {mid:.2f}x (median) the time; overhead {mid - 1:+.0%} (median; "
            "target <= +20%)"
        )
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
        print(f"{len(tasks)} valid procedural bugs on tinystats for parts 1 and 2")
        if not tasks:
            raise SystemExit("no valid procedural bug on tinystats: parts 1 and 2 have nothing to run")
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
