"""Wall time per task of the probe reward (`hard`) vs the solver-in-the-loop reward (K=8), on the same
batch of generated tasks, with the same embedded model as reference and solver, in one run.

The probe is an untrained linear head in the bundle format (scoring costs the same as a trained
one). Target: the probe reward at least 100x cheaper per task.

    python benchmarks/reward_cost.py
"""

import tempfile
import time
from pathlib import Path

import torch

from propel_core.config import validate_config
from propel_core.embedded import EMBEDDED_MODEL_ID
from propel_core.plugins import Registry
from propel_core.probes import TrainedProbe, load_probe, save_bundle
from propel_core.records import ProbeBundle
from propel_core.reward import RewardScorer
from propel_core.run import Run

TASKS, K, LAYER = 8, 8, 15


def main() -> None:
    registry = Registry.build()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        head = registry.get("probe_architectures", "linear")(576)
        save_bundle(folder / "probe", TrainedProbe(head, torch.zeros(576), torch.ones(576), epochs=0),
                    ProbeBundle(reference_model=EMBEDDED_MODEL_ID, layer=LAYER, pooling="last_token",
                                architecture="linear", input_dim=576, max_length=2048, training_rows=0))  # fmt: skip
        base = {"run_dir": str(folder), "domain": {"name": "countdown"}, "label": {"k": K},
                "solver": {"batch_size": 8, "sampling": {"temperature": 0.6, "top_p": 0.95, "top_k": 20,
                                                         "max_new_tokens": 128}}}  # fmt: skip
        probe_run = Run(validate_config(base | {"reward": {"rule": "hard"}}, registry), registry, quiet=True)
        sil_run = Run(
            validate_config(base | {"reward": {"rule": "solver_in_the_loop"}}, registry), registry, quiet=True
        )
        domain = probe_run.domain()
        puzzles = [example for context in domain.contexts() for example in context.data["examples"]][:TASKS]
        prompt = domain.generator_prompt(domain.contexts()[0])
        completions = [[{"role": "assistant", "content": domain.render(p).removeprefix("Target:")}] for p in puzzles]

        probe_scorer = RewardScorer(probe_run, [load_probe(folder / "probe", registry)])
        sil_scorer = RewardScorer(sil_run, [])
        probe_scorer([prompt] * TASKS, completions)  # warm-up: loads the reference
        sil_scorer([prompt], completions[:1])  # warm-up: the solver is the same loaded model

        start = time.perf_counter()
        probe_rewards = probe_scorer([prompt] * TASKS, completions)
        t_probe = (time.perf_counter() - start) / TASKS
        start = time.perf_counter()
        sil_rewards = sil_scorer([prompt] * TASKS, completions)
        t_sil = (time.perf_counter() - start) / TASKS

    valid = sum(r != probe_run.config.reward.r_bad for r in probe_rewards)
    print(f"{TASKS} generated countdown tasks ({valid} valid), embedded model as reference and solver")
    print(f"hard (probe) reward:           {t_probe * 1000:9.1f} ms per task")
    print(f"solver_in_the_loop (K={K}):     {t_sil * 1000:9.1f} ms per task  (in band: {sum(sil_rewards)} of {valid})")
    print(f"probe reward is {t_sil / t_probe:.0f}x cheaper per task (target >= 100x)")


if __name__ == "__main__":
    main()
