"""Checkpoints and resume: where a training goes on from, what a resumed run keeps of its logs, and the
adapter it saves at the end.

A training folder that holds a training's records goes on from its last checkpoint, or is refused when
it has none to go on from; starting over is asked for (``checkpoint.resume: false``) and moves the old
folder aside whole (``FOLDER.old-TIME``), never deletes it."""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from propel_core.errors import PropelError
from propel_core.provenance import holds_records
from propel_core.ranks import is_main, together
from propel_core.records import keep_entries
from propel_core.training.generator_reward import COMPLETIONS

log = logging.getLogger("propel")


def last_checkpoint(folder: Path) -> Path | None:
    """The folder's checkpoint of the most steps (TRL's ``checkpoint-N``), if any."""
    found = [
        path
        for path in Path(folder).glob("checkpoint-*")
        if path.name.split("-")[-1].isdigit() and (path / "trainer_state.json").exists()  # saved whole
    ]
    return max(found, key=step_of, default=None)


def step_of(checkpoint: Path | None) -> int:
    """The optimizer steps a checkpoint was saved after (0 for none)."""
    return int(checkpoint.name.split("-")[-1]) if checkpoint is not None else 0


#: a training's logs (one left empty by a failed start holds no record) and its folders besides checkpoints
LOGS = ("log.jsonl", "reward_log.jsonl", COMPLETIONS, "rollouts.jsonl", "audit.jsonl")
FOLDERS = ("adapter", "audit", "best_audited")


def training_records(folder: Path) -> list[Path]:
    """What ``folder`` holds of a training: its checkpoints (whole or not), adapter, audits and logs."""
    folder = Path(folder)
    found = [*folder.glob("checkpoint-*"), *(folder / name for name in FOLDERS if (folder / name).exists())]
    return sorted(found + [folder / name for name in LOGS if holds_records(folder / name)])


def goes_on(folder: Path, resume: bool) -> bool:
    """Whether a training into ``folder`` adds to what is there (for ``Run.claim``): resuming, and the
    folder holds a training's records, a checkpoint or not (a changed setting is refused from the first
    logged step)."""
    return resume and bool(training_records(folder))


def resume_point(folder: Path, resume: bool) -> Path | None:
    """The checkpoint a training into ``folder`` goes on from: resuming, its last one; None to start
    afresh. Resuming a folder that holds a training's records with no checkpoint saved whole (stopped
    before its first, or its checkpoints removed) is refused in one line: a plain rerun never starts
    over on top of records, ``checkpoint.resume=false`` does (:func:`prepare_folder`)."""
    if not resume:
        return None
    checkpoint = last_checkpoint(folder)
    if checkpoint is None and (found := training_records(folder)):
        held = ", ".join(path.name for path in found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise PropelError(
            f"{folder} holds a training ({held}) but no checkpoint to resume from: pass checkpoint.resume=false to "
            f"start over (its folder is moved aside to {folder.name}.old-TIME, not deleted), or use a new run_dir"
        )
    return checkpoint


def prepare_folder(folder: Path, resume: bool, say: Callable[[str], None] = log.warning) -> Path | None:
    """The checkpoint a training run goes on from (:func:`resume_point`); starting over, a folder that
    holds a training's records is moved aside whole first (:func:`moved_aside`, said with ``say``: a
    stage passes its ``say``, and calls it before any model loads), so no later resume picks up a
    checkpoint of another run, nothing reads an old adapter as the new training's while it runs (or
    after it failed), and nothing is lost. Called again, it finds the folder as it left it. Under a
    launch the main process moves it while the others wait."""
    checkpoint = resume_point(folder, resume)
    if checkpoint is None and is_main():
        if training_records(folder):
            say(f"starting {folder} over: the training it held is kept in {moved_aside(folder)}")
        folder.mkdir(parents=True, exist_ok=True)
    together()
    return checkpoint


def moved_aside(folder: Path) -> Path:
    """Rename ``folder`` to a sibling ``FOLDER.old-YYYYMMDD-HHMMSS`` (UTC; ``-2``, ``-3``, ... after it
    when taken) and return where it went."""
    stamp = f"{folder.name}.old-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    aside, n = folder.with_name(stamp), 2
    while aside.exists():
        aside, n = folder.with_name(f"{stamp}-{n}"), n + 1
    folder.rename(aside)
    return aside


def keep_steps_before(log_path: Path, step: int) -> None:
    """Drop a per-step log's entries (the reward log, the completions) of steps a resumed run will redo
    (``step`` and later): the main process of a launch does, while the others wait."""
    if is_main():
        keep_entries(log_path, lambda entry: entry["step"] < step)
    together()


def train_and_save(trainer, folder: Path, base: str, checkpoint: Path | None = None, finished: bool = False) -> None:
    """Run a TRL trainer (from ``checkpoint`` when given), save its LoRA adapter to ``folder/adapter``
    and its metrics to ``log.jsonl``. A checkpoint at the last step, or one ``finished`` says ends the
    training (an audit's stop rule), is the result itself: nothing trains again, its adapter and log
    are kept. The adapter is saved in float32 whatever the training computed in (DeepSpeed saves
    bfloat16 under TRL's default bf16). Under a launch every process trains and saves (DeepSpeed
    gathers the weights), the main one alone writes."""
    if checkpoint is not None and (finished or step_of(checkpoint) >= trainer.args.max_steps):
        log.info("%s is at the last step (%d): nothing to train", checkpoint, trainer.args.max_steps)
        if not is_main():
            return
        shutil.rmtree(folder / "adapter", ignore_errors=True)
        (folder / "adapter").mkdir()
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            shutil.copy(checkpoint / name, folder / "adapter" / name)
        in_float32(folder / "adapter" / "adapter_model.safetensors")
        history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    else:
        if checkpoint is not None:
            log.info("resuming from %s (checkpoint.resume: false starts over)", checkpoint)
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        trainer.save_model(str(folder / "adapter"))
        together()
        if not is_main():
            return
        in_float32(folder / "adapter" / "adapter_model.safetensors")
        tidy_card(folder / "README.md", base)
        history = trainer.state.log_history
    with (folder / "log.jsonl").open("w") as handle:
        for entry in history:
            handle.write(json.dumps(entry) + "\n")


def in_float32(weights: Path) -> None:
    """Rewrite a safetensors file whose floating tensors are not all float32 with them in float32 (and
    its metadata), so an adapter has one dtype however it was trained."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    tensors = load_file(weights)
    if all(tensor.dtype == torch.float32 for tensor in tensors.values() if tensor.is_floating_point()):
        return
    with safe_open(weights, "pt") as handle:
        metadata = handle.metadata()
    save_file({name: t.float() if t.is_floating_point() else t for name, t in tensors.items()}, weights, metadata)


def tidy_card(card: Path, base: str) -> None:
    """TRL's model card (``README.md`` of a training folder), made to say the same in every run and to
    name its base: TRL lists the tags from a set, in an order string hashing changes from process to
    process, and names the base model only by a hub id it reads from the model's config, so a local
    folder (the embedded default's converted weights) reads "[None]"; ``base`` is where the weights
    came from (``embedded.model_source``)."""
    if not card.exists():
        return
    unnamed = "a fine-tuned version of [None](https://huggingface.co/None)"
    text = card.read_text().replace(unnamed, f"trained from {base}")
    lines = text.split("\n")
    if "tags:" in lines:
        start = end = lines.index("tags:") + 1
        while end < len(lines) and lines[end].startswith("- "):
            end += 1
        lines = [*lines[:start], *sorted(lines[start:end]), *lines[end:]]
    card.write_text("\n".join(lines))
