"""What each file of a run folder was made with, so a command never mixes two settings in one file.

``RUN/settings.json`` records, per resumable output (``tasks.jsonl``, ``labels.jsonl``, ``eval``,
``train``, ``solve/NAME``), the config values it depends on: its own (DEPENDS) and those of the files
it is made from, its own winning where both name a key (the probe stage reads ``reward.*`` to select a
probe, but an adapter was trained with the train stage's own ``reward.*``). A stage may add keys and
values only it knows (the probe bundles a reward reads, by content). A command that would add to an
output made with other values refuses, naming the keys that differ and the ways out. Values that
change how work runs but not what it computes (batch sizes, devices, executors, retries, progress,
tracking) are not recorded, so changing them stays allowed; nor is a task count, since task ``i`` is
the same whatever the count: a corpus or an evaluation may grow.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

from propel_core.errors import PropelError
from propel_core.records import replace_whole

EVAL_MORE = ("label.min_valid_attempts", "generate.context_sampler", "generate.sampler_options")
#: the reward settings every rule shares; a rule's own options (``reward.options.RULE``) are added by the
#: stage that knows which rule it uses (``more_keys``), so another rule's options change nothing
REWARD = ("reward.rule", "reward.r_bad", "reward.overflow_reward", "reward.main_probe", "reward.probes")

#: what the generator's training depends on (train and coevolve)
GENERATOR_TRAINING = (
    "seed", "domain", "train", "lora", *REWARD, "generator", "generate.context_sampler", "generate.sampler_options"
)  # fmt: skip
#: output -> (the config keys it depends on, as dotted prefixes; the outputs it is made from)
DEPENDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "tasks.jsonl": (("seed", "domain", "generator", "generate"), ()),
    "labels.jsonl": (
        ("solver", "label.k", "label.band_low", "label.band_high", "label.min_valid_attempts"),
        ("tasks.jsonl",),
    ),
    "probes": (("probe", "reference", *REWARD), ("labels.jsonl",)),
    "train": (GENERATOR_TRAINING, ("probes",)),
    # and the reward coevolve trains with (rule: coevolve.mode), which the stage passes as values
    "coevolve": (GENERATOR_TRAINING, ("probes",)),
    "eval": (  # each arm (eval/ARM) also records its adapter's content, whichever training made it
        ("seed", "domain", "generator", "solver", "evaluate", "label.band_low", "label.band_high", *EVAL_MORE),
        (),
    ),
    "solve": (
        ("seed", "domain", "solver", "solve_train", "lora"),
        (),
    ),
    # and the rule's own options (reward.options.RULE), which the stage passes
    "rounds": (
        (*GENERATOR_TRAINING, "solver", "solve_train", "label", "probe", "reference", "rounds"),
        ("probes",),
    ),
}

#: the last part of a key that never changes what an output holds: how work runs, and how many tasks
#: (task i is the same whatever the count, so a corpus or an evaluation may grow)
IRRELEVANT = frozenset(
    {"batch_size", "device", "max_concurrency", "max_retries", "api_key_env", "num_tasks", "num_rounds"}
)

FILE = "settings.json"

#: how each output starts over, for the refusal's message
RESTART = {"train": "checkpoint.resume=false", "solve": "checkpoint.resume=false"}

#: how a new run folder can go on from this one's inputs, for the refusal's message
NEW_RUN = {"train": " (training there on this run's probe: reward.main_probe={run_dir}/probes/selected)"}


def flat(data: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as ``{"a.b.c": value}``; lists stay values."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out |= flat(value, f"{prefix}.{key}" if prefix else str(key))
    return out


def settings_of(
    output: str, config: dict[str, Any], recorded: dict[str, dict[str, Any]], more_keys: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The values ``output`` depends on under ``config`` (a dumped PropelConfig): its inputs' values as
    recorded (as ``config`` gives them where an input has no record), then its own keys (DEPENDS and
    ``more_keys``), which replace whatever an input recorded under them (an option the input had and
    ``config`` has not is gone, not inherited). A component's options are recorded whatever their
    names; elsewhere a key whose last part is IRRELEVANT is not."""
    keys, inputs = DEPENDS[output.split("/")[0]]
    prefixes = (*keys, *more_keys)

    def own(key: str) -> bool:  # a key naming components brings what registered them (KEY_plugins)
        return any(key == p or key.startswith((p + ".", p + "_plugins.")) for p in prefixes)

    values: dict[str, Any] = {}
    for name in inputs:
        values |= recorded.get(name) or settings_of(name, config, recorded)
    return {key: value for key, value in values.items() if not own(key)} | {
        key: value for key, value in flat(config).items() if own(key) and relevant(key)
    }


def relevant(key: str) -> bool:
    """Whether a config key can change what an output holds: not one of IRRELEVANT's, unless it is a
    component's own option (``domain.options.batch_size`` is the domain's to mean)."""
    parts = key.split(".")
    return parts[-1] not in IRRELEVANT or any(part.endswith("options") for part in parts[:-1])


def differences(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``key: old -> new`` for every key whose value differs, the least nested first: a changed setting
    (``reward.rule``) before what follows from it (the new rule's options, spelled out)."""
    return [
        f"{key}: {json.dumps(before.get(key))} -> {json.dumps(now.get(key))}"
        for key in sorted(set(before) | set(now), key=lambda key: (key.count("."), key))
        if before.get(key) != now.get(key)
    ]


def claim(
    run_dir: Path,
    output: str,
    config: dict[str, Any],
    exists: bool,
    allow_changed: bool,
    more_keys: tuple[str, ...] = (),
    values: dict[str, Any] | None = None,
    spelled_out: frozenset[str] = frozenset(),
) -> None:
    """Before a command adds to ``output`` (which already holds records when ``exists``): refuse when it
    was made with other values, unless ``allow_changed``; record the values it is made with now. A stage
    names config keys its output depends on in this run only (``more_keys``) and values that are not
    config (``values``). ``config`` is ``config.resolved``'s (components' defaults and versions spelled
    out); ``spelled_out`` names the keys that adds. One of those a record lacks is not compared: the
    record (or an input it took values from) was made before propel spelled them out, or the option
    is new; one it holds is, so an option set then and defaulted now still counts."""
    path = Path(run_dir) / FILE
    recorded = json.loads(path.read_text()) if path.exists() else {}
    now = settings_of(output, config, recorded, more_keys) | (values or {})
    before = recorded.get(output)
    if before is not None:
        before = before | {key: now[key] for key in now if key in spelled_out and key not in before}
    if exists and before is not None and before != now and not allow_changed:
        changed = differences(before, now)
        shown = "; ".join(changed[:4]) + (f"; and {len(changed) - 4} more" if len(changed) > 4 else "")
        kind = output.split("/")[0]
        new_run = NEW_RUN.get(kind, "").format(run_dir=run_dir)
        raise PropelError(
            f"{Path(run_dir) / output} was made with other settings ({shown}): use a new run_dir{new_run}, start "
            f"it over ({RESTART.get(kind, 'remove it')}), or pass allow_changed_settings=true to add to it anyway"
        )
    recorded[output] = now
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    replace_whole(path, (json.dumps(recorded, indent=2, sort_keys=True) + "\n").encode())


def holds_records(*paths: Path) -> bool:
    """Whether any of ``paths`` holds a record (a file a failed start left empty does not)."""
    return any(Path(path).is_file() and Path(path).stat().st_size > 0 for path in paths)


def folder_digest(folder: Path) -> str | None:
    """A digest of every file under ``folder`` (names and bytes; None when there is no such folder): what
    a probe bundle is, whatever its path."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(folder)}\0{path.stat().st_size}\0".encode())
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


REFUSALS = "refusals.json"


def record_refusal(run_dir: Path, stage: str, reason: str | None, blocks: tuple[str, ...] = ()) -> None:
    """Keep why ``stage`` refused, and the stages it holds up (``blocks``), in ``RUN/refusals.json``
    for ``propel report``; None: it finished, so its reason goes. Best effort: a run folder that cannot
    be written loses the note, not the stage's own error."""
    path = Path(run_dir) / REFUSALS
    with contextlib.suppress(OSError, ValueError):
        found = refusals(run_dir)
        if reason is None and stage not in found:
            return
        if reason is None:
            found.pop(stage)
        else:
            found[stage] = {"reason": reason, "blocks": list(blocks)}
        replace_whole(path, (json.dumps(found, indent=2) + "\n").encode())


def kept_object(path: Path) -> dict[str, Any]:
    """The JSON object a run folder keeps at ``path``: none where the file is missing, unreadable or
    holds another shape (what reads it checks each entry's)."""
    try:
        found = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def refusals(run_dir: Path) -> dict[str, dict[str, Any]]:
    """``stage -> {"reason": str, "blocks": [stage, ...]}`` for every stage whose last run refused; an
    unreadable file, or an entry of another shape, counts as none."""
    return {
        stage: {"reason": entry["reason"], "blocks": entry["blocks"]}
        for stage, entry in kept_object(Path(run_dir) / REFUSALS).items()
        if isinstance(entry, dict)
        and isinstance(entry.get("reason"), str)
        and isinstance(entry.get("blocks"), list)
        and all(isinstance(name, str) for name in entry["blocks"])
    }


TIMINGS = "timings.json"


def record_time(run_dir: Path, stage: str, seconds: float, ended: str) -> None:
    """Add ``seconds`` of wall time to what ``stage`` has taken in this run folder (every run of it that
    ended, however: ``finished``, ``refused``, ``failed`` or ``interrupted``, which ``ended`` says of
    this one) in ``RUN/timings.json``, for ``propel report``. A process killed outright records
    nothing. Best effort, as :func:`record_refusal`."""
    path = Path(run_dir) / TIMINGS
    with contextlib.suppress(OSError, ValueError):
        found = stage_times(run_dir)
        before = found.get(stage, {}).get("seconds", 0.0)
        found[stage] = {"seconds": before + seconds, "ended": ended}
        replace_whole(path, (json.dumps(found, indent=2) + "\n").encode())


def stage_times(run_dir: Path) -> dict[str, dict[str, Any]]:
    """``stage -> {"seconds": float, "ended": str}`` as :func:`record_time` keeps them; an unreadable
    file, or an entry of another shape, counts as none."""
    return {
        stage: {"seconds": float(entry["seconds"]), "ended": entry["ended"]}
        for stage, entry in kept_object(Path(run_dir) / TIMINGS).items()
        if isinstance(entry, dict)
        and isinstance(entry.get("seconds"), int | float)
        and isinstance(entry.get("ended"), str)
    }
