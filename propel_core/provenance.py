"""What each file of a run folder was made with, so a command never mixes two settings in one file.

``RUN/settings.json`` records, per resumable output (``tasks.jsonl``, ``labels.jsonl``, ``eval``,
``train``, ``solve/NAME``), the config values it depends on: its own (DEPENDS) and those of the files
it is made from. A command that would add to an output made with other values refuses, naming the keys
that differ and the ways out. Values that change how work runs but not what it computes (batch sizes,
devices, executors, retries, progress, tracking) are not recorded, so changing them stays allowed; nor
is a task count, since task ``i`` is the same whatever the count: a corpus or an evaluation may grow.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from propel_core.errors import PropelError

EVAL_MORE = ("label.min_valid_attempts", "generate.context_sampler", "generate.sampler_options")

#: output -> (the config keys it depends on, as dotted prefixes; the outputs it is made from)
DEPENDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "tasks.jsonl": (("seed", "domain", "generator", "generate"), ()),
    "labels.jsonl": (
        ("solver", "label.k", "label.band_low", "label.band_high", "label.min_valid_attempts"),
        ("tasks.jsonl",),
    ),
    "probes": (("probe", "reference", "reward"), ("labels.jsonl",)),
    "train": (
        ("seed", "domain", "train", "reward", "generator", "generate.context_sampler", "generate.sampler_options"),
        ("probes",),
    ),
    "eval": (
        ("seed", "domain", "generator", "solver", "evaluate", "label.band_low", "label.band_high", *EVAL_MORE),
        ("train",),
    ),
    "solve": (
        ("seed", "domain", "solver", "solve_train", "train.lora_r", "train.lora_alpha", "train.lora_target_modules"),
        (),
    ),
}

#: the last part of a key that never changes what an output holds: how work runs, and how many tasks
#: (task i is the same whatever the count, so a corpus or an evaluation may grow)
IRRELEVANT = frozenset(
    {"batch_size", "device", "max_concurrency", "max_retries", "api_key_env", "checkpoint_every", "resume", "num_tasks"}
)

FILE = "settings.json"

#: how each output starts over, for the refusal's message
RESTART = {"train": "train.resume=false", "solve": "train.resume=false"}


def flat(data: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as ``{"a.b.c": value}``; lists stay values."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out |= flat(value, f"{prefix}.{key}" if prefix else str(key))
    return out


def settings_of(output: str, config: dict[str, Any], recorded: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The values ``output`` depends on under ``config`` (a dumped PropelConfig): its own keys, and its
    inputs' values as recorded (as ``config`` gives them where an input has no record)."""
    keys, inputs = DEPENDS[output.split("/")[0]]
    values = {
        key: value
        for key, value in flat(config).items()
        if any(key == p or key.startswith(p + ".") for p in keys) and key.rsplit(".", 1)[-1] not in IRRELEVANT
    }
    for name in inputs:
        values |= recorded.get(name) or settings_of(name, config, recorded)
    return values


def differences(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``key: old -> new`` for every key whose value differs."""
    return [
        f"{key}: {json.dumps(before.get(key))} -> {json.dumps(now.get(key))}"
        for key in sorted(set(before) | set(now))
        if before.get(key) != now.get(key)
    ]


def claim(run_dir: Path, output: str, config: dict[str, Any], exists: bool, allow_changed: bool) -> None:
    """Before a command adds to ``output`` (which already holds records when ``exists``): refuse when it
    was made with other values, unless ``allow_changed``; record the values it is made with now."""
    path = Path(run_dir) / FILE
    recorded = json.loads(path.read_text()) if path.exists() else {}
    now = settings_of(output, config, recorded)
    before = recorded.get(output)
    if exists and before is not None and before != now and not allow_changed:
        changed = differences(before, now)
        shown = "; ".join(changed[:4]) + (f"; and {len(changed) - 4} more" if len(changed) > 4 else "")
        raise PropelError(
            f"{Path(run_dir) / output} was made with other settings ({shown}): use a new run_dir, start it over "
            f"({RESTART.get(output.split('/')[0], 'remove it')}), or pass allow_changed_settings=true to add to it "
            "anyway"
        )
    recorded[output] = now
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")  # whole or not at all, whoever reads it meanwhile
    partial.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
    os.replace(partial, path)


def holds_records(*paths: Path) -> bool:
    """Whether any of ``paths`` holds a record (a file a failed start left empty does not)."""
    return any(Path(path).is_file() and Path(path).stat().st_size > 0 for path in paths)
