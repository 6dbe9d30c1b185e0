"""Wall time per task of the probe reward (rule ``hard``) vs the solver-in-the-loop reward (K=8).

Compares: the two reward rules' scorers (propel's RewardScorer, as GRPO calls it) on the same batch of
tasks written by the embedded generator through propel's own generate code (default generator
sampling; arithmetic, the quick start's domain, unless ``--domain`` names another), with the embedded
model as the probe's reference and as the solver (default solver sampling: temperature 0.6, top-p
0.95, top-k 20, up to 1,024 new tokens). No external peer: the solver-in-the-loop rule is the paper's
baseline the probe replaces. Invalid tasks cost the solver nothing (their reward is ``r_bad``), so the
cost is printed per generated task (what a GRPO batch pays) and per valid task.

The probe is an untrained linear head in the bundle format at the middle layer (scoring costs the
same as a trained one). One scorer call scores the whole batch, as GRPO calls it; every call sees new
task ids, so the solver's seeds differ per call as they do step to step in training. A warm-up (a
probe call, which loads the shared model, and a solver-in-the-loop call on one task) comes first;
then the arms are interleaved (timing.compare). The solver's cost per task hardly depends on the
batch (the executor runs each task's K attempts as one 8-row generate call), so a small batch keeps
a run to minutes; a countdown task the 135M solver cannot solve runs to the full 1,024 new tokens
and costs minutes on 2 CPU cores. Target: the probe reward at least 100x cheaper per task.

    python benchmarks/reward_cost.py [--domain arithmetic] [--tasks 8] [--repeats 2] [--capped-tokens 128]

``--capped-tokens N`` adds a third arm, the solver in the loop capped at N new tokens, to show how
much of its cost the long default budget is (0 leaves it out).
"""

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
from timing import compare, ratio, report

from propel_core.embedded import EMBEDDED_MODEL_ID
from propel_core.execution import sample_tasks, solver_labels
from propel_core.plans import validate_config
from propel_core.plugins import Registry
from propel_core.probes.bundles import save_bundle
from propel_core.probes.heads import TrainedProbe
from propel_core.records import ProbeBundle
from propel_core.run import Run
from propel_core.training.generator_reward import reward_scorer

K, LAYER = 8, 15


def scorer(run: Run, probe: Path):
    """The reward function the train stage gives GRPO under the run's config (the probe bundle read
    only by a rule that needs it)."""
    plan = run.plans.train
    return reward_scorer(run.services, plan.reward, plan.train, probe, solver_labels(run.services, plan.solve))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--domain", default="arithmetic", help="the domain whose tasks are generated and scored")
    parser.add_argument("--tasks", type=int, default=8, help="generated tasks per reward call")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--capped-tokens", type=int, default=128)
    args = parser.parse_args()
    registry = Registry.build()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        head = registry.get("probe_architectures", "linear")(576)
        save_bundle(
            folder / "probe",
            TrainedProbe(head, torch.zeros(576), torch.ones(576), epochs=0),
            ProbeBundle(
                reference_model=EMBEDDED_MODEL_ID,
                layer=LAYER,
                pooling="last_token",
                architecture="linear",
                input_dim=576,
                max_length=2048,
                training_rows=0,
                lowest_valid_logit=0.0,  # no corpus: an untrained head, taken to give valid tasks 0 or more
            ),
        )
        base = {
            "run_dir": str(folder),
            "domain": {"name": args.domain},
            "label": {"k": K},
            "generate": {"num_tasks": args.tasks},
        }
        runs = {"probe": Run(validate_config(base | {"reward": {"rule": "hard"}}, registry), registry, quiet=True)}
        runs["sil"] = Run(
            validate_config(base | {"reward": {"rule": "solver_in_the_loop"}}, registry), registry, quiet=True
        )
        if args.capped_tokens:
            capped = base | {
                "reward": {"rule": "solver_in_the_loop"},
                "solver": {"sampling": {"max_new_tokens": args.capped_tokens}},
            }
            runs["capped"] = Run(validate_config(capped, registry), registry, quiet=True)

        generator = runs["probe"]
        config = generator.config
        contexts = generator.context_sampler(config.seed).sample(config.generate.num_tasks)
        tasks = sample_tasks(generator.services, config.generator, contexts, folder / "tasks.jsonl", config.seed)
        domain = generator.domain()
        contexts = {context.id: context for context in domain.contexts()}
        prompts = [domain.generator_prompt(contexts[task.context_id]) for task in tasks]
        completions = [
            [{"role": "assistant", "content": task.generation.removeprefix(prompt[-1]["content"])}]
            for task, prompt in zip(tasks, prompts, strict=True)
        ]
        ids = [task.context_id for task in tasks]
        valid = sum(task.validity.valid for task in tasks)
        if not valid:
            raise SystemExit(
                f"none of the {len(tasks)} generated tasks is valid, so the solver would run on "
                "nothing: rerun with more --tasks"
            )

        scorers = {name: scorer(run, folder / "probe") for name, run in runs.items()}
        rewards: dict[str, list[float]] = {}

        def arm(name: str):
            def call() -> None:
                rewards[name] = scorers[name](prompts, completions, context_id=ids)

            return call

        solver = runs["sil"].config.solver.sampling
        names = {
            "probe": "probe reward (hard), one reference forward",
            "sil": f"solver in the loop, K={K}, default solver ({solver.max_new_tokens} new tokens)",
            "capped": f"solver in the loop, K={K}, capped at {args.capped_tokens} new tokens",
        }
        # warm-up: the probe call loads the shared embedded model; one solver-in-the-loop call on a valid
        # task runs the solver path (executor, sampling, grading) once before anything is timed
        arm("probe")()
        one = next(i for i, task in enumerate(tasks) if task.validity.valid)
        scorers["sil"](prompts[one : one + 1], completions[one : one + 1], context_id=ids[one : one + 1])
        times = compare({names[name]: arm(name) for name in runs}, repeats=args.repeats, warmup=0)

    print(
        f"{len(tasks)} {args.domain} tasks generated by the embedded model (default generator sampling), "
        f"{valid} valid; "
        f"embedded model as the probe's reference and as the solver; {torch.get_num_threads()} threads"
    )
    report(
        "reward wall time per call of the scorer (one GRPO reward batch)",
        times,
        baseline=names["probe"],
        per=(len(tasks), "tasks"),
    )
    for name in runs:
        if name != "probe":
            low, mid = ratio(times, names[name], names["probe"])
            print(
                f"probe reward vs {names[name]}: {low:.0f}x (min), {mid:.0f}x (median) cheaper per task "
                f"(target >= 100x); last call's rewards {rewards[name]}"
            )
    for name, seconds in times.items():
        print(
            f"  {name}: {statistics.median(seconds) / len(tasks):.3f} s per generated task, "
            f"{statistics.median(seconds) / valid:.3f} s per valid task (medians)"
        )


if __name__ == "__main__":
    main()
