"""The execution layer on the embedded model: concurrent episodes with batched turns give the same
trajectories as one at a time, with fewer model calls; generate killed and resumed writes what an
uninterrupted run writes."""

import json
import sys
from pathlib import Path

import pytest

from propel_core import hookimpl
from propel_core.config import DomainConfig, ModelConfig, Sampling
from propel_core.contracts import Attempt, Episode
from propel_core.domain import Domain, ParseError, Verdict
from propel_core.errors import PropelError
from propel_core.execution import job_seed, task_id
from propel_core.records import Context, Task, iter_jsonl
from propel_core.testing import kill_when_written
from propel_core.worker import Worker
from propel_plugins.executors import LocalExecutor

pytestmark = pytest.mark.slow

TOPICS = ("color", "fruit", "river", "planet", "tool", "bird", "city", "metal")


class Talk(Domain):
    """A multi-turn domain with no sandbox: each episode is three model turns."""

    multi_turn = True

    def contexts(self):
        return [Context(id=topic, data={"topic": topic}) for topic in TOPICS]

    def generator_prompt(self, context):
        return [{"role": "user", "content": f"Name a {context.data['topic']}."}]

    def episode(self, context, reply, seed):
        messages, turns = self.generator_prompt(context), []
        for _ in range(3):
            turns.append(reply(messages))
            messages += [{"role": "assistant", "content": turns[-1]}, {"role": "user", "content": "Another one."}]
        return json.dumps(turns)

    def parse(self, generation):
        try:
            return {"turns": json.loads(generation)}
        except ValueError:
            raise ParseError("not JSON") from None

    def render(self, payload):
        return payload["turns"]

    def solver_prompt(self, payload):
        return [{"role": "user", "content": f"Say it again: {payload['turns'][0]}"}]

    def solver_episode(self, payload, reply):
        messages = self.solver_prompt(payload)
        first = reply(messages)
        return (
            first
            + "\n"
            + reply([*messages, {"role": "assistant", "content": first}, {"role": "user", "content": "Once more."}])
        )

    def grade(self, payload, attempt):
        return Verdict(payload["turns"][0].split()[:1] == attempt.split()[:1])


class TalkPlugin:
    @staticmethod
    @hookimpl
    def register_domains(register):
        register("talk", Talk)


def run_all(worker, jobs, workers):
    executor = LocalExecutor(workers=workers)
    results = dict(executor.run(worker, jobs))
    return results, executor.generate_calls


def test_batched_turns_give_the_same_episodes_with_fewer_calls(propel_register_plugin):
    """Greedy episodes, then sampled attempts (each row draws from its own seeded stream)."""
    registry = propel_register_plugin(TalkPlugin)
    greedy = Sampling(temperature=0.0, max_new_tokens=8)
    worker = Worker(DomainConfig(name="talk"), ModelConfig(), greedy, registry, registry.domain("talk"))
    episodes = [
        Episode(task_id(i), context, job_seed(0, task_id(i))) for i, context in enumerate(worker.domain.contexts())
    ]
    batched, batched_calls = run_all(worker, episodes, workers=8)
    alone, alone_calls = run_all(worker, episodes, workers=1)
    assert {job.task_id: task for job, task in batched.items()} == {job.task_id: task for job, task in alone.items()}
    assert alone_calls == 24 and batched_calls <= 6  # 8 episodes x 3 turns, one at a time vs batched

    tasks = [task for task in batched.values() if task.validity.valid]
    worker.sampling = Sampling(temperature=0.9, top_p=0.95, max_new_tokens=8)
    attempts = [Attempt(task, j, job_seed(0, task.id, j)) for task in tasks[:4] for j in range(2)]
    solved_batched, calls = run_all(worker, attempts, workers=8)
    solved_alone, _ = run_all(worker, attempts, workers=1)
    assert {(job.task.id, job.index): a for job, a in solved_batched.items()} == {
        (job.task.id, job.index): a for job, a in solved_alone.items()
    }
    assert calls <= 4


def test_an_episode_that_fails_costs_its_attempt_and_a_backend_that_fails_stops_the_run(propel_register_plugin):
    """Model output that breaks the domain's own episode code (an IndexError here) costs that attempt
    alone, ungradable with the error as its reason; a backend that cannot answer (a PropelError)
    stops the run and the jobs beside it."""
    registry = propel_register_plugin(TalkPlugin)
    domain = registry.domain("talk")
    broken = Task(
        id="x",
        domain="talk",
        context_id="c",
        generation="",
        payload={"turns": []},
        validity={"valid": True},
        generator="m",
    )
    jobs = [Attempt(broken, j, j) for j in range(6)]
    worker = Worker(DomainConfig(name="talk"), ModelConfig(), Sampling(max_new_tokens=4), registry, domain)
    results = [attempt for _, attempt in LocalExecutor(workers=3).run(worker, jobs)]
    assert [(a.solved, a.reason.split(":")[0]) for a in results] == [(None, "episode failed")] * 6
    no_server = ModelConfig(backend="openai", model="m")  # no base_url: the backend cannot be built
    fine = Task(**{**broken.model_dump(), "payload": {"turns": ["a"]}})
    worker = Worker(DomainConfig(name="talk"), no_server, Sampling(max_new_tokens=4), registry, domain)
    executor = LocalExecutor(workers=3)
    with pytest.raises(PropelError, match="needs base_url"):
        list(executor.run(worker, [Attempt(fine, j, j) for j in range(6)]))
    assert executor.in_flight == 0


def generate_config(folder: Path) -> Path:
    path = folder / "run.yaml"
    path.write_text(
        f"run_dir: {folder}\ndomain: {{name: arithmetic}}\ngenerate: {{num_tasks: 16}}\nexecutor: {{workers: 4}}\n"
        "generator: {batch_size: 4, sampling: {temperature: 1.0, top_p: 0.95, max_new_tokens: 20}}\n"
    )
    return path


def test_generate_killed_and_resumed_writes_what_an_uninterrupted_run_writes(tmp_path, propel_cli):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir(), cut.mkdir()
    propel_cli("-q", "generate", str(generate_config(whole)))
    tasks_path = cut / "tasks.jsonl"
    kill_when_written(
        [str(Path(sys.executable).with_name("propel")), "-q", "generate", str(generate_config(cut))], tasks_path, 5
    )
    assert 5 <= len(list(iter_jsonl(tasks_path, Task))) < 16
    propel_cli("-q", "generate", str(cut / "run.yaml"))
    by_id = lambda path: sorted(list(iter_jsonl(path, Task)), key=lambda task: task.id)  # noqa: E731
    assert by_id(tasks_path) == by_id(whole / "tasks.jsonl")
    assert len(by_id(tasks_path)) == 16


class ThreadsSeen:
    """A job runner whose model turn records torch's thread count (no model: the count is the point)."""

    def __init__(self):
        self.seen = set()

    def key(self):
        return "threads"

    def generate(self, prompts, sampling, n=1, seed=None):
        import torch

        self.seen.add(torch.get_num_threads())
        return [["x"] * n for _ in prompts]

    def run(self, job, generate=None):
        return (generate or self.generate)(["p"], Sampling())[0][0]


@pytest.mark.parametrize("workers", [1, 2, 8])
def test_the_local_executor_shares_the_cores_among_its_workers(workers, monkeypatch):
    import torch

    from propel_plugins import executors
    from propel_plugins.executors import available_cores

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setattr(executors, "busy_threads", lambda: 0)  # a quiet machine
    before, runner = torch.get_num_threads(), ThreadsSeen()
    assert len(dict(LocalExecutor(workers=workers).run(runner, list(range(6))))) == 6
    assert runner.seen == {max(1, available_cores() - workers + 1)}
    assert torch.get_num_threads() == before  # given back when the jobs are done

    monkeypatch.setattr(executors, "busy_threads", lambda: 2)  # two threads of other processes running
    runner = ThreadsSeen()
    dict(LocalExecutor(workers=workers).run(runner, list(range(3))))
    assert runner.seen == {max(1, available_cores() - workers + 1 - 2)}

    runner = ThreadsSeen()
    dict(LocalExecutor(workers=workers, torch_threads=3).run(runner, list(range(3))))
    assert runner.seen == {3}  # executor.options.torch_threads

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(5)
    try:
        runner = ThreadsSeen()
        dict(LocalExecutor(workers=workers).run(runner, list(range(3))))
        assert runner.seen == {5}  # the user chose: kept
    finally:
        torch.set_num_threads(before)


def test_busy_processes_beside_are_counted():
    """The executor's and a training's thread choice counts the threads of other processes running now:
    CPU-bound processes in their own sessions, as a neighbour's jobs are."""
    import subprocess

    from propel_plugins.executors import busy_threads

    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(2)]
    try:
        assert busy_threads() >= 2
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
