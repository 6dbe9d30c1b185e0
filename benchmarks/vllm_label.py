"""The vllm backend against the transformers backend and against bare vLLM, in one run on this machine.

1. the label stage's model work: K = 8 attempts at each of the demo config's arithmetic tasks (written
   by the embedded generator through the generate code; the demo's solver sampling, 16 new tokens),
   through the execution layer with 64 workers, as ``propel label`` runs them: the transformers
   backend (float32, its shared prompt pass) vs the vllm backend (vLLM's CPU build here) vs bare
   ``vllm.LLM.chat`` on the same conversations with n = 8 per request, on the same engine (the peer:
   propel's own overhead is the vllm arm against it; the goal is at least 0.8x). Attempts and
   generated tokens per second, from the median.
2. engine start-up: building the vllm backend (a fresh engine: eager, float32, 2 GiB KV cache) vs
   loading the transformers backend.
3. (``--parts grpo``) one GRPO step of the train stage with and without vLLM rollouts (TRL's colocate mode,
   the weights synced each step): TRL's step time, the first step left out, over ``--steps`` steps on
   a planted countdown probe. Two trainings, one after the other (each starts its own engine or
   model), so these are not interleaved: the steps within each are the repeats.

Arms 1 and 2 are interleaved (timing.compare), arm 1 after a warm-up round; min and median, ratios
from one run.

    python benchmarks/vllm_label.py [--repeats 3] [--parts label,start-up,grpo] [--steps 4]
"""

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from timing import compare, ratio, report

from propel_core.config import ModelConfig
from propel_core.contracts import Attempt
from propel_core.execution import job_seed, sample_tasks
from propel_core.plans import load_config, validate_config
from propel_core.plugins import Registry
from propel_core.run import Run
from propel_core.worker import Worker
from propel_plugins.executors import LocalExecutor

ROOT = Path(__file__).resolve().parent.parent
K = 8


def demo_tasks(tmp: Path, count: int):
    demo = load_config(
        ROOT / "propel_core" / "configs" / "demo.yaml", [f"run_dir={tmp / 'written'}", "generate.num_tasks=48"]
    )
    writer = Run(demo, Registry.build(), quiet=True)
    contexts = writer.context_sampler(demo.seed).sample(demo.generate.num_tasks)
    written = sample_tasks(writer.services, demo.generator, contexts, writer.dir / "tasks.jsonl", demo.seed)
    tasks = [task for task in written if task.validity.valid][:count]
    print(f"  ({len(tasks)} valid arithmetic tasks of {len(written)} written by the embedded generator)")
    return demo, tasks


def label_arms(tmp: Path, count: int, repeats: int) -> None:
    from vllm import SamplingParams

    demo, tasks = demo_tasks(tmp, count)
    registry = Registry.build()
    sampling = demo.solver.sampling
    jobs = [Attempt(task, j, job_seed(demo.seed, task.id, j)) for task in tasks for j in range(K)]
    workers, tokens = {}, {}
    for backend in ("transformers", "vllm"):
        role = {"backend": backend, "sampling": sampling.model_dump()}
        config = validate_config(
            {"run_dir": str(tmp / backend), "domain": {"name": "arithmetic"}, "solver": role}, registry
        )
        run = Run(config, registry, quiet=True)
        workers[backend] = Worker(config.domain, config.solver, sampling, registry, run.domain())
    engine = workers["vllm"].backend
    tokenizer = engine.llm.get_tokenizer()
    domain = workers["vllm"].domain
    # the peer gets the very requests propel's arm makes: each attempt's prompt (a prefilled answer
    # start, continued) with its own seed, n = 1 each, in one call
    conversations = [domain.solver_prompt(job.task.payload) for job in jobs]
    assert all(message[-1]["role"] == "assistant" for message in conversations)
    cores = len(os.sched_getaffinity(0))

    def through_propel(backend):
        def arm():
            executor = LocalExecutor(64, torch_threads=cores)
            attempts = [attempt for _, attempt in executor.run(workers[backend], jobs)]
            tokens[backend] = sum(len(tokenizer(a.text, add_special_tokens=False)["input_ids"]) for a in attempts)

        return arm

    def bare():
        params = [
            SamplingParams(
                n=1,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                max_tokens=sampling.max_new_tokens,
                seed=job.seed,
            )
            for job in jobs
        ]
        outputs = engine.llm.chat(
            conversations, params, use_tqdm=False, add_generation_prompt=False, continue_final_message=True
        )
        tokens["bare"] = sum(len(c.token_ids) for o in outputs for c in o.outputs)

    arms = {
        "bare vllm.LLM.chat (peer)": bare,
        "propel, vllm backend": through_propel("vllm"),
        "propel, transformers backend": through_propel("transformers"),
    }
    times = compare(arms, repeats=repeats, warmup=1)
    report(
        f"1. label: {len(jobs)} attempts ({len(tasks)} tasks x K = {K}, {sampling.max_new_tokens} new tokens), "
        "64 workers",
        times,
        baseline="bare vllm.LLM.chat (peer)",
        per=(len(jobs), "attempts"),
    )
    print(f"  (each arm with {cores} torch threads in this process; vLLM's engine runs in its own process)")
    for name, key in zip(arms, ("bare", "vllm", "transformers"), strict=True):
        print(f"  {name}: {tokens[key] / statistics.median(times[name]):.1f} generated tokens/s (median)")
    low, mid = ratio(times, "propel, vllm backend", "bare vllm.LLM.chat (peer)")
    print(f"  propel's vllm backend vs bare vLLM: {1 / low:.2f}x (min), {1 / mid:.2f}x (median) (goal >= 0.8x)")
    low, mid = ratio(times, "propel, transformers backend", "propel, vllm backend")
    print(f"  vllm backend vs transformers backend: {low:.2f}x (min), {mid:.2f}x (median)")


def start_up(repeats: int) -> None:
    import gc

    from propel_plugins.backends import TransformersBackend
    from propel_plugins.vllm_backend import VLLMBackend

    def fresh_engine():
        backend = VLLMBackend(ModelConfig(backend="vllm"))
        backend.llm.llm_engine.engine_core.shutdown()  # its process and KV cache gone before the next arm
        del backend
        gc.collect()

    arms = {
        "transformers backend": lambda: TransformersBackend(ModelConfig()),
        "vllm backend (fresh engine)": fresh_engine,
    }
    times = compare(arms, repeats=repeats, warmup=0)
    report("2. start-up: the embedded model, loaded and ready to generate", times, baseline="transformers backend")


def grpo(tmp: Path, steps: int) -> None:
    from propel_core.stages.extract import extract
    from propel_core.stages.probe import probe
    from propel_core.stages.train import train
    from propel_core.testing import planted_countdown_run

    folder = planted_countdown_run(tmp / "grpo")
    base = {
        "run_dir": str(folder),
        "domain": {"name": "countdown"},
        "probe": {"layers": [8], "poolings": ["mean_full"], "architectures": ["linear"]},
        "checkpoint": {"every": 1000},
    }
    registry = Registry.build()
    extract(Run(validate_config(base, registry), registry, quiet=True))
    probe(Run(validate_config(base, registry), registry, quiet=True))
    step_times = {}
    for use_vllm in (False, True):
        settings = {
            "steps": steps,
            "group_size": 8,
            "per_device_batch": 16,
            "gradient_accumulation": 1,  # one generation batch of 16 completions per optimizer step
            "max_completion_length": 64,
        }
        data = base | {"train": settings | {"use_vllm": use_vllm}, "checkpoint": {"every": 1000, "resume": False}}
        started = time.perf_counter()
        train(Run(validate_config(data, registry), registry, quiet=True))
        whole = time.perf_counter() - started
        logged = [json.loads(line) for line in (folder / "train" / "log.jsonl").read_text().splitlines()]
        times = [entry["step_time"] for entry in logged if "step_time" in entry][1:]
        name = "with vLLM rollouts (colocate)" if use_vllm else "with transformers generation"
        step_times[name] = times
        print(f"  {name}: whole training {whole:.1f} s, steps after the first: {[round(t, 2) for t in times]}")
    report(
        f"3. GRPO step (16 completions of up to 64 tokens, 2 prompts x 8), steps 2..{steps}",
        step_times,
        baseline="with transformers generation",
    )


PARTS = ("label", "start-up", "grpo")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--parts", default="label,start-up", help=f"which parts to run, of {','.join(PARTS)}")
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps per training")
    args = parser.parse_args()
    parts = args.parts.split(",")
    if unknown := set(parts) - set(PARTS):
        parser.error(f"unknown part {sorted(unknown)[0]!r}; choose from {', '.join(PARTS)}")
    with tempfile.TemporaryDirectory() as tmp:
        if "label" in parts:
            label_arms(Path(tmp), args.tasks, args.repeats)
        if "start-up" in parts:
            start_up(2)
        if "grpo" in parts:
            grpo(Path(tmp), args.steps)


if __name__ == "__main__":
    main()
