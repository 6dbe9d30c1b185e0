"""The ``trace`` context sampler: the generator's prompt conditioned on a trace of recently attempted
tasks and their outcomes (the paper's future work, section 8), read from a real labels file (the
arithmetic domain's tasks labeled by its simulated solver) and shown to the embedded model."""

import itertools
import re
from pathlib import Path

import pytest

from propel_core.errors import PropelError
from propel_core.plans import ConfigError, load_config, validate_config
from propel_core.plugins import Registry
from propel_core.records import Context, JsonlWriter, Task, iter_jsonl
from propel_core.run import Run
from propel_core.worker import TRACE_PREAMBLE, traced, tracing

# solve rates of the simulated solver (propel_arithmetic.skill): 95%, 76%, 52%, 33%, 10% each for the last four
EXERCISES = ["3 + 4", "23 + 4", "7 * 8", "23 * 45", "hello", "2 + 2", "31 * 17"]
EXERCISES += ["96 / 12 * 11", "48 / 16 * 35", "72 / 18 * 13", "84 / 12 * 15"]
LINE = re.compile(r"solved (\d)/8: Compute: (.+)")


@pytest.fixture(scope="module")
def registry():
    return Registry.build()


@pytest.fixture(scope="module")
def attempted(tmp_path_factory, registry) -> Path:
    """The last round's labels.jsonl: EXERCISES as tasks, labeled with 8 attempts by the simulated solver."""
    from propel_core.domain import make_task
    from propel_core.execution import task_id
    from propel_core.stages.label import label

    folder = tmp_path_factory.mktemp("last_round")
    data = {"run_dir": str(folder), "domain": {"name": "arithmetic"}, "solver": {"backend": "arithmetic_skill"}}
    run = Run(validate_config(data, registry), registry, quiet=True)
    domain = run.domain()
    contexts, predicates = domain.contexts(), registry.validity_predicates(domain)
    with JsonlWriter(folder / "tasks.jsonl") as out:
        for i, text in enumerate(EXERCISES):
            out.write(make_task(task_id(i), domain, contexts[i], f"Compute: {text}", "m", predicates))
    run.claim("tasks.jsonl", exists=False)
    label(run)
    return folder / "labels.jsonl"


def trace_run(folder: Path, registry: Registry, **options) -> Run:
    data = {
        "run_dir": str(folder),
        "seed": 7,
        "domain": {"name": "arithmetic"},
        "generator": {"sampling": {"max_new_tokens": 12}},
        "generate": {"num_tasks": 3, "context_sampler": "trace" if options else "uniform", "sampler_options": options},
    }
    return Run(validate_config(data, registry), registry, quiet=True)


def test_configured_from_yaml_it_draws_each_group_in_turn(tmp_path, attempted):
    yaml = tmp_path / "run.yaml"
    yaml.write_text(
        f"run_dir: {tmp_path / 'run'}\ndomain: {{name: arithmetic}}\ngenerate:\n  context_sampler: trace\n"
        f"  sampler_options: {{trace: {attempted}, inner: progress, inner_options: {{tau: 0.5}}, size: 3}}\n"
    )
    registry = Registry.build()
    assert "trace" in registry.names("context_samplers")
    run = Run(load_config(yaml, registry=registry), registry, quiet=True)
    sampler = run.context_sampler(3)
    assert sampler.inner.tau == 0.5  # the inner sampler got its options
    groups = sampler.diagnostics()["trace_tasks"]
    assert all(groups.values()) and sum(groups.values()) == 10, groups  # every valid task, "hello" is not one
    texts = {task.text for task in iter_jsonl(attempted.parent / "tasks.jsonl", Task)}
    for context in sampler.sample(5):
        lines = [LINE.fullmatch(line) for line in context.trace.split("\n")]
        assert len(lines) == 3 and all(lines), context.trace
        assert all(f"Compute: {line[2]}" in texts for line in lines)
        solved = [int(line[1]) for line in lines]
        assert solved == sorted(solved, reverse=True)
        assert solved[0] > 3 and 1 <= solved[1] <= 3 and solved[2] < 1  # mastered, in band, failed: one each


def test_the_same_seed_gives_the_same_contexts_and_the_inner_ones(tmp_path, attempted, registry):
    draw = lambda seed, **options: trace_run(tmp_path, registry, **options).context_sampler(seed).sample(20)  # noqa: E731
    first, again = draw(1, trace=str(attempted)), draw(1, trace=str(attempted))
    assert first == again
    assert [c.trace for c in draw(2, trace=str(attempted))] != [c.trace for c in first]
    assert [c.model_copy(update={"trace": None}) for c in first] == draw(1)  # uniform's own draws, traced
    assert len({c.trace for c in first}) > 1  # each context's trace drawn anew


@pytest.mark.slow
def test_the_model_reads_the_trace_and_otherwise_the_plain_prompt(tmp_path, attempted, registry, monkeypatch):
    """generate with the plain prompt and with the trace: the same contexts, seeds and sampling, and the
    prompts the embedded model receives differ by the trace after the last user message alone."""
    from propel_core.execution import job_seed, task_id
    from propel_core.stages.generate import generate

    plain, with_trace = (
        trace_run(tmp_path / "plain", registry),
        trace_run(tmp_path / "trace", registry, trace=str(attempted)),
    )
    backend = registry.backend(plain.config.generator)
    received: dict[str, dict] = {"plain": {}, "trace": {}}
    model_generate = backend.generate

    def recording(prompts, sampling, n=1, seed=None):
        for prompt, one_seed in zip(prompts, seed, strict=True):
            received[arm][one_seed] = (prompt, sampling)
        return model_generate(prompts, sampling, n=n, seed=seed)

    monkeypatch.setattr(backend, "generate", recording)
    arm = "plain"
    generate(plain)
    arm = "trace"
    generate(with_trace)
    contexts = with_trace.context_sampler(7).sample(3)
    tasks = {name: list(iter_jsonl(tmp_path / name / "tasks.jsonl", Task)) for name in received}
    assert [t.context_id for t in tasks["plain"]] == [t.context_id for t in tasks["trace"]] == [c.id for c in contexts]
    assert received["plain"].keys() == received["trace"].keys() and len(received["plain"]) == 3
    for i, context in enumerate(contexts):
        seed = job_seed(7, task_id(i))
        (plain_prompt, plain_sampling), (trace_prompt, trace_sampling) = (
            received["plain"][seed],
            received["trace"][seed],
        )
        assert plain_sampling == trace_sampling
        assert trace_prompt == traced(plain_prompt, context.trace) != plain_prompt
        user, prefill = trace_prompt[-2:]
        assert user["content"].endswith(f"\n\n{TRACE_PREAMBLE}\n{context.trace}") and prefill["content"] == "Compute:"


def test_the_trainers_prompts_show_the_trace(tmp_path, attempted, registry):
    """What propel train's GRPO trainer reads: each prompt drawn when the trainer asks, with its trace."""
    from transformers import AutoTokenizer

    from propel_core.backend import prompt_text
    from propel_core.embedded import resolve_model
    from propel_core.training.trainer import sampled_prompts

    run = trace_run(tmp_path, registry, trace=str(attempted))
    generator, domain = run.config.generator, run.domain()
    path = resolve_model(generator.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    dataset = sampled_prompts(run.context_sampler(7), domain.generator_prompt, tokenizer, generator.chat_template, path)
    rows = list(itertools.islice(dataset, 3))
    for row, context in zip(rows, run.context_sampler(7).sample(3), strict=True):
        messages = traced(domain.generator_prompt(context), context.trace)
        assert row["prompt"] == prompt_text(tokenizer, messages, generator.chat_template, path)
        assert f"{TRACE_PREAMBLE}\n{context.trace}" in row["prompt"] and row["context_id"] == context.id


def test_every_turn_of_an_episode_shows_the_trace_where_the_first_prompt_ended():
    seen = []
    reply = tracing(lambda messages: seen.append(messages) or "ok", "solved 8/8: Compute: 1 + 1")
    first = [{"role": "system", "content": "s"}, {"role": "user", "content": "write a task"}]
    reply(first)
    reply([*first, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "tool output"}])
    shown = f"write a task\n\n{TRACE_PREAMBLE}\nsolved 8/8: Compute: 1 + 1"
    assert [turn[1]["content"] for turn in seen] == [shown, shown] and seen[1][3]["content"] == "tool output"
    assert traced(first, None) is first
    with pytest.raises(PropelError, match="no user message to show the context's trace in"):
        traced([{"role": "system", "content": "s"}], "solved 1/8: x")
    assert Context.model_validate({"id": "c", "data": {}}).trace is None  # a context written before traces reads


def test_bad_options_are_refused_when_the_config_is_read(tmp_path, attempted, registry):
    empty = tmp_path / "empty" / "labels.jsonl"
    empty.parent.mkdir()
    empty.write_text("")
    alone = tmp_path / "alone" / "labels.jsonl"
    alone.parent.mkdir()
    alone.write_bytes(attempted.read_bytes())
    refusals = {
        "no labels file /nowhere/labels.jsonl": {"trace": "/nowhere/labels.jsonl"},
        f"{empty} is empty: no attempted tasks": {"trace": str(empty)},
        f"no tasks.jsonl beside {alone}": {"trace": str(alone)},
        "option 'inner' = 'progres': Input should be 'uniform' or 'progress'": {
            "trace": str(attempted),
            "inner": "progres",
        },
        "option 'size' = 0: Input should be greater than 0": {"trace": str(attempted), "size": 0},
        "option 'inner_options': context sampler 'uniform' takes no option 'tau'": {
            "trace": str(attempted),
            "inner_options": {"tau": 0.5},
        },
        "context sampler 'trace' needs the option 'trace'": {"size": 2},
    }
    for expected, options in refusals.items():
        with pytest.raises(ConfigError) as refused:
            trace_run(tmp_path / "run", registry, **options)
        lines = str(refused.value).splitlines()
        assert lines[0] == "invalid config:" and expected in lines[1], (expected, lines)
        assert len(lines) == 2 or "progres" in expected  # an unknown inner is also no sampler to give options
    with pytest.raises(ConfigError, match=r"solve_train.context_sampler: trace conditions the generator's prompt"):
        validate_config(
            {
                "run_dir": str(tmp_path / "run"),
                "domain": {"name": "arithmetic"},
                "solve_train": {"context_sampler": "trace", "sampler_options": {"trace": str(attempted)}},
            },
            registry,
        )
    assert not (tmp_path / "run").exists()


def test_a_labels_file_with_no_graded_task_to_show_is_refused_before_any_generation(tmp_path, attempted, registry):
    folder = tmp_path / "other"
    folder.mkdir()
    (folder / "labels.jsonl").write_bytes(attempted.read_bytes())
    (folder / "tasks.jsonl").write_text("")  # none of the labels' tasks
    run = trace_run(tmp_path / "run", registry, trace=str(folder / "labels.jsonl"))
    with pytest.raises(
        PropelError, match=r"holds no graded label of a task in .*tasks.jsonl: no attempted task to show"
    ):
        run.context_sampler(7)
