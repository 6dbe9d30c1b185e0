"""Where the train stage's memory goes: resident memory (RSS) of the process at each point of the train
stage on the demo config, and the peak, with the bytes of the two model copies it holds.

Compares nothing with a peer: it is a breakdown. The run is the demo's (arithmetic, the embedded model
as generator and as the probe's frozen reference, GRPO + LoRA, 8 completions a step of up to 20 tokens)
for ``--steps`` steps, with an untrained linear probe bundle at layer 15 (scoring costs what a trained
one costs). RSS is read from /proc/self/status (VmRSS; VmHWM for the peak) before and after each part:
imports, the probe's reference model, the policy, the trainer (LoRA wrapping), then each GRPO step.
Within the steps, a thread samples RSS every millisecond or so and charges each sample to the phase
running then (the innermost of: sampling completions, the probe reward, a log-prob forward pass, the
loss, the rest of the training step, which is mostly the backward pass; outside them the optimizer
step and the trainer's bookkeeping), so each phase gets its own peak.

    python benchmarks/train_memory.py [--steps 2]
"""

import argparse
import functools
import tempfile
import threading
from pathlib import Path

from demo_training import train_demo


def rss() -> tuple[float, float]:
    """(current, peak) resident memory of this process, in MiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2, help="GRPO steps (the demo runs 8)")
    steps = parser.parse_args().steps
    points: list[tuple[str, float, float]] = []

    def mark(what: str) -> None:
        points.append((what, *rss()))

    mark("python started")
    import peft  # noqa: F401
    import torch
    import transformers  # noqa: F401
    import trl  # noqa: F401
    from transformers import TrainerCallback

    from propel_core.training import generator, generator_reward

    mark("torch, transformers, trl, peft imported")
    sizes = {}

    def measured(name, function, size_of):
        def wrapper(*args, **kwargs):
            out = function(*args, **kwargs)
            sizes[name] = size_of(out)
            mark(name)
            return out

        return wrapper

    def parameter_bytes(model) -> float:
        return sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20

    reference = "the probe's frozen reference model loaded"
    loaded = generator_reward.load_probe
    generator_reward.load_probe = measured(reference, loaded, lambda p: parameter_bytes(p.backend.model))
    generator.load_policy = measured(
        "the policy (generator) loaded", generator.load_policy, lambda loaded: parameter_bytes(loaded[1])
    )

    class Steps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            mark(f"GRPO step {state.global_step} done")

    def train_and_save(trainer, folder, *args, **options):
        mark("GRPO trainer built (LoRA wrapped)")
        trainer.add_callback(Steps())
        sampler.start()
        saving(trainer, folder, *args, **options)

    saving = generator.train_and_save
    generator.train_and_save = train_and_save

    phases: list[str] = []  # the running phases, innermost last
    peaks: dict[str, float] = {}

    def phase(name: str, owner, method: str) -> None:
        function = getattr(owner, method)

        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            phases.append(name)
            try:
                return function(*args, **kwargs)
            finally:
                phases.pop()

        setattr(owner, method, wrapper)

    from trl import GRPOTrainer

    from propel_core.training.generator_reward import RewardScorer

    phase("the rest of the training step (backward)", GRPOTrainer, "training_step")
    phase("the rest of generation and scoring", GRPOTrainer, "_generate_and_score_completions")
    phase("sampling completions (policy generate)", GRPOTrainer, "_generate")
    phase("the probe reward (reference forward)", RewardScorer, "__call__")
    phase("the loss (policy forward)", GRPOTrainer, "compute_loss")
    phase("log-prob forward passes (policy, adapters off)", GRPOTrainer, "_get_per_token_logps_and_entropies")
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.001):
            where = phases[-1] if phases else "outside: optimizer step, trainer bookkeeping"
            peaks[where] = max(peaks.get(where, 0.0), rss()[0])

    sampler = threading.Thread(target=sample, daemon=True)

    with tempfile.TemporaryDirectory() as tmp:
        train_demo(Path(tmp), steps)
        sampling.set()
    mark("train stage returned")

    print(f"train stage on the demo config, {steps} GRPO steps, {torch.get_num_threads()} threads: resident memory")
    previous = 0.0
    for what, now, peak in points:
        print(f"  {what:<45} RSS {now:7.0f} MiB ({now - previous:+6.0f})  peak so far {peak:7.0f} MiB")
        previous = now
    for name, mib in sizes.items():
        print(f"  parameters of {name.split(' loaded')[0]}: {mib:.0f} MiB")
    print("peak RSS per phase (sampled; the innermost phase running)")
    for name, mib in sorted(peaks.items(), key=lambda item: -item[1]):
        print(f"  {name:<50} {mib:7.0f} MiB")


if __name__ == "__main__":
    main()
