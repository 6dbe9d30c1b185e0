"""The label stage's solver calls at the demo's settings: the K attempts at a task share one prompt pass
(the transformers backend now) vs run it K times (the backend before, and plain Hugging Face sampling).

Settings from propel_core/configs/demo.yaml: arithmetic tasks, solver batch 64, K=8 attempts, temperature
0.6, top-p 0.95, top-k 20, 16 new tokens, the embedded model, 64 executor workers.

1. One solver call, 8 tasks x K=8 = 64 rows (one solver batch), three arms:
   - ``plain transformers (peer)``: ``model.generate(num_return_sequences=8, do_sample=True)`` on the 8
     prompts, which expands each prompt 8 times before the prompt pass;
   - ``propel before``: ``backend.generate(prompts, n=8)`` with ``_share_prefill = False``, the old path
     (every row runs its own prompt pass);
   - ``propel``: ``backend.generate(prompts, n=8)``, each distinct prompt's pass run once and its KV cache
     copied to its 8 rows. The two propel arms must sample the same texts (same seeds).
2. The label stage end to end (``propel_core.stages.label.label``, in this process, the model loaded once
   beforehand): 16 arithmetic tasks x K=8, the demo's solver, label and executor settings, a fresh run
   folder per call; ``propel before`` vs ``propel``, which must write the same labels.

Target: ``propel`` at least 1.3x faster than ``propel before`` on the label stage.

    python benchmarks/label.py [--repeats 3] [--tasks 16] [--skip-stage]
"""

import argparse
import contextlib
import io
import os
import tempfile
from pathlib import Path

import torch
from timing import compare, ratio, report

from propel_core.domain import make_task
from propel_core.plans import validate_config
from propel_core.plugins import Registry
from propel_core.records import JsonlWriter, Label, iter_jsonl
from propel_core.run import Run
from propel_core.stages.label import label

PEER, BEFORE, OURS = "plain transformers generate (peer)", "propel before (prompt pass per row)", "propel"
DEMO = {  # the parts of demo.yaml the label stage reads
    "domain": {"name": "arithmetic"},
    "solver": {"batch_size": 64, "sampling": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 16}},
    "label": {"k": 8},
    "executor": {"workers": 64},
    "seed": 0,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=16, help="tasks in the end-to-end label stage")
    parser.add_argument("--skip-stage", action="store_true", help="time the solver call only")
    args = parser.parse_args()

    registry = Registry.build()
    base = validate_config({**DEMO, "run_dir": tempfile.mkdtemp()}, registry)
    backend = registry.backend(base.solver)
    sampling, k = base.solver.sampling, base.label.k
    domain = registry.domain("arithmetic")
    expressions = [example for context in domain.contexts() for example in context.data["examples"]]
    print(
        f"{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, device {backend.device}, {backend.model_id}"
    )

    prompts = [domain.solver_prompt({"expression": expression}) for expression in expressions[:8]]
    backend.tokenizer.padding_side = "left"
    batch = backend.tokenizer(
        [backend.prompt_text(p) for p in prompts], return_tensors="pt", padding=True, add_special_tokens=False
    ).to(backend.device)
    texts = {}

    def peer():
        torch.manual_seed(0)
        with torch.inference_mode():
            backend.model.generate(
                **batch,
                do_sample=True,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                max_new_tokens=sampling.max_new_tokens,
                num_return_sequences=k,
                pad_token_id=backend.tokenizer.pad_token_id,
            )

    def propel(share: bool):
        def call():
            backend._share_prefill = share
            texts[share] = backend.generate(prompts, sampling, n=k, seed=list(range(len(prompts))))

        return call

    times = compare({PEER: peer, BEFORE: propel(False), OURS: propel(True)}, repeats=args.repeats)
    assert texts[False] == texts[True], "sharing the prompt pass changed what was sampled"
    print(f"(prompt: {batch['input_ids'].shape[1]} tokens at most; the propel arms sampled identical texts)")
    report(
        f"one solver call: {len(prompts)} arithmetic tasks x K={k} attempts, up to {sampling.max_new_tokens} "
        "new tokens",
        times,
        baseline=BEFORE,
        per=(len(prompts) * k, "attempts"),
    )
    print("  propel vs peer: {:.2f}x min, {:.2f}x median".format(*ratio(times, PEER, OURS)))

    if args.skip_stage:
        return
    labels = {}

    def stage(share: bool):
        def call():
            backend._share_prefill = share
            folder = Path(tempfile.mkdtemp())
            run = Run(validate_config({**DEMO, "run_dir": str(folder)}, registry), registry, quiet=True)
            write_tasks(folder, run.domain(), expressions[: args.tasks])
            with contextlib.redirect_stdout(io.StringIO()):  # the stage's summary
                label(run)
            labels[share] = sorted(list(iter_jsonl(folder / "labels.jsonl", Label)), key=lambda x: x.task_id)

        return call

    times = compare({BEFORE: stage(False), OURS: stage(True)}, repeats=args.repeats, warmup=0)
    assert labels[False] == labels[True], "sharing the prompt pass changed the labels"
    report(
        f"the label stage: {args.tasks} arithmetic tasks x K={k}, demo settings (the same labels from both)",
        times,
        baseline=BEFORE,
        per=(args.tasks * k, "attempts"),
    )


def write_tasks(folder: Path, domain, expressions: list[str]) -> None:
    predicates = domain.registry.validity_predicates(domain)
    with JsonlWriter(folder / "tasks.jsonl") as out:
        for i, expression in enumerate(expressions):
            context = domain.contexts()[i // 2]
            out.write(make_task(f"t{i:03d}", domain, context, f"Compute: {expression}", "bench", predicates))


if __name__ == "__main__":
    main()
