"""The processes of one ``accelerate launch`` (DDP, DeepSpeed, FSDP): which one this is, and what they
share.

Under a launch of N processes the stages ``train`` and ``solve-train`` run in every process: each
trains on its share of each step's batch, and the reward functions gather what every process scored
so that the step's record, the context sampler and the alarms see the whole batch. The main process
(rank 0) alone writes the run's files (``config.yaml``, ``settings.json``, the logs, the adapter's
card) and says what a stage found; the others wait for it where they would read what it writes.
Every other stage runs in one process and refuses a launch of several (docs/scaling.md).
"""

from __future__ import annotations

import logging
import os
import re
from datetime import timedelta
from pathlib import Path

#: seconds a process waits for the others at a gather or barrier: transformers' ddp_timeout default
DDP_TIMEOUT = 1800

#: the stages that run in every process of a launch; any other refuses one of several processes
DISTRIBUTED_STAGES = ("train", "solve-train")


def process_count() -> int:
    """How many processes the launch started (1 without one)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def process_index() -> int:
    """This process's rank in the launch (0 without one)."""
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    """Whether this is the process that writes the run's files (rank 0, or the only one)."""
    return process_index() == 0


def join() -> None:
    """Join the launch's process group now (accelerate's shared state, which the trainers reuse, set up
    for the CPU where there is no GPU as their ``use_cpu`` is: else it would stay undistributed), so
    ``together`` and ``gathered`` work before a trainer exists. The other processes log warnings and
    errors only."""
    if process_count() > 1:
        import torch
        from accelerate import PartialState

        # as the trainers' use_cpu (gloo on CPU) and their ddp_timeout (torch's default is 10 minutes)
        PartialState(cpu=not torch.cuda.is_available(), timeout=timedelta(seconds=DDP_TIMEOUT))
    if not is_main():  # its progress lines would repeat the main process's
        logging.getLogger("propel").setLevel(logging.WARNING)


def sharded() -> bool:
    """Whether the launch shards the policy's weights over its processes (FSDP)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def stopping_together():
    """A trainer callback that ends the training in every process when one of them decided to (the
    main process's audit stop rule), so none waits at a step the others never take."""
    from transformers import TrainerCallback

    class StoppingTogether(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if any(gathered(control.should_training_stop)):
                control.should_training_stop = True

    return StoppingTogether()


def together() -> None:
    """Wait until every process of the launch has come here."""
    if process_count() > 1:
        import torch.distributed

        torch.distributed.barrier()


def gathered(value) -> list:
    """``value`` of every process, in rank order (``[value]`` in one process)."""
    if process_count() == 1:
        return [value]
    import torch.distributed

    out = [None] * process_count()
    torch.distributed.all_gather_object(out, value)
    return out


def asked_processes(parent: Path | None = None) -> int | None:
    """The ``--num_processes`` of the ``accelerate launch`` this process was started by (its parent's
    command line, ``/proc/PID/cmdline`` where there is one), else None."""
    if "ACCELERATE_MIXED_PRECISION" not in os.environ:  # not started by accelerate launch
        return None
    path = parent or Path(f"/proc/{os.getppid()}/cmdline")
    try:
        words = path.read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    for i, word in enumerate(words):
        found = re.fullmatch(r"--num[_-]processes(?:=(\d+))?", word)
        if found and (found.group(1) or (i + 1 < len(words) and words[i + 1].isdigit())):
            return int(found.group(1) or words[i + 1])
    return None


def launch_warning() -> str | None:
    """One line when a launch asked for several processes and started one (``accelerate launch
    --cpu --num_processes N`` runs one process), else None."""
    asked = asked_processes()
    if asked is None or asked <= 1 or process_count() > 1:
        return None
    return (
        f"accelerate launch asked for {asked} processes and started one, so this training is not distributed "
        "(its --cpu runs a single process); on CPU use --multi_gpu, which runs the processes over gloo"
    )
