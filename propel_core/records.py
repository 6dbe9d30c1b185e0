"""Typed records shared by all stages, the codec that writes them, and the JSONL files they live in.

Stage files are JSON Lines a user can open in any editor: one record a line, each line written whole
and flushed, so a crash leaves at most one torn final line, which readers skip and writers cut off
before appending. A write that fails (a full disk) is cut back at once and reported as a PropelError
naming the file.

Everything in a record may come from a model, so the codec is exact or it refuses, never lossy:
``encode`` writes any string, including one that is not valid UTF-8 (a lone surrogate, or the escapes
``os.fsdecode`` makes of a file name's undecodable bytes), as ``\\u`` escapes where it must, and
refuses a non-finite number instead of writing ``null`` and a surrogate pair held as two code points
instead of writing what reads back as one character; ``decode`` reads back exactly what was
written, at any depth ``check_value`` allows. ``check_value`` says why a value a model produced
cannot be stored as it is (nested deeper than ``MAX_DEPTH``, a non-finite number, an integer of more
than ``MAX_INT_DIGITS`` digits, more than ``MAX_VALUE_BYTES`` in all, a type JSON does not have, a
split surrogate pair);
``domain.make_task`` rejects such a task at parse time with that reason.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import math
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from propel_core.errors import PropelError, file_error

log = logging.getLogger("propel")

MAX_DEPTH = 64  # lists and objects nested in one value a model wrote
MAX_INT_DIGITS = 1000
MAX_VALUE_BYTES = 4 << 20  # the strings and numbers of one value, roughly as JSON writes them
# a high surrogate then a low one, as two code points: JSON has no way to write them that does not
# read back as the one character the pair encodes
SPLIT_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")


def check_value(value: Any, where: str = "$") -> str | None:
    """Why ``value`` cannot be stored in a record exactly as it is, or None when it can: only JSON's
    own types (dict with str keys, list, str, int, float, bool, None), finite numbers, integers of at
    most ``MAX_INT_DIGITS`` digits, at most ``MAX_DEPTH`` levels and ``MAX_VALUE_BYTES`` bytes. Any
    string is fine. Iterative, so no depth breaks the check itself."""
    size = 0
    pending = [(value, where, 0)]
    while pending:
        item, path, depth = pending.pop()
        kind = type(item)
        if kind is str:
            if SPLIT_PAIR.search(item):
                return f"a surrogate pair written as two code points at {path} (JSON reads it back as one)"
            size += len(item) + 2
        elif item is None or kind is bool:
            size += 5
        elif kind is int:
            if item.bit_length() > MAX_INT_DIGITS * 3.33:
                return f"an integer of more than {MAX_INT_DIGITS} digits at {path}"
            size += item.bit_length() // 3 + 1
        elif kind is float:
            if not math.isfinite(item):
                return f"a non-finite number ({item}) at {path}"
            size += 24
        elif kind is list or kind is dict:
            if depth >= MAX_DEPTH:
                return f"nested deeper than {MAX_DEPTH} levels at {path}"
            if kind is dict:
                if bad := [key for key in item if type(key) is not str]:
                    return f"a key of type {type(bad[0]).__name__} at {path}"
                if any(SPLIT_PAIR.search(key) for key in item):
                    return f"a surrogate pair written as two code points in a key at {path}"
                pending += [(child, f"{path}.{key}"[:200], depth + 1) for key, child in item.items()]
                size += sum(len(key) + 4 for key in item)
            else:
                pending += [(child, f"{path}[{i}]"[:200], depth + 1) for i, child in enumerate(item)]
            size += 2
        else:
            return f"a {kind.__name__} at {path} (records hold JSON values only)"
        if size > MAX_VALUE_BYTES:
            return f"more than {MAX_VALUE_BYTES >> 20} MiB"
    return None


def to_json(data: Any, **options: Any) -> str:
    """JSON text for plain data, exact: a string that is not valid UTF-8 makes the text use ``\\u``
    escapes (so the text can always be written as UTF-8); a non-finite number, or a surrogate pair
    held as two code points (which no JSON text reads back as two), raises ValueError."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, **options)
    try:
        text.encode()
    except UnicodeEncodeError:
        if SPLIT_PAIR.search(text):  # surrogates occur only inside strings: the search is exact
            raise ValueError("a surrogate pair held as two code points cannot be written exactly") from None
        return json.dumps(data, ensure_ascii=True, allow_nan=False, **options)
    return text


def readable(value: Any) -> Any:
    """``value`` for a file or a screen meant for people (report.html, exported columns, console
    lines, tracker text): each string in it, in lists, tuples and dicts too, made valid UTF-8, with
    ``\\u`` escapes for what a model or a file name left that is not (a lone surrogate, undecodable
    bytes). The run's records keep such strings exactly; only what people read is escaped."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode()
        return value
    if isinstance(value, list | tuple):
        return [readable(item) for item in value]
    if isinstance(value, dict):
        return {readable(key): readable(item) for key, item in value.items()}
    return value


def write_readable(path: Path, text: str) -> None:
    """Write a file for people: ``text`` made ``readable``, as UTF-8 whatever the locale."""
    path.write_text(readable(text), encoding="utf-8")


def encode(record: BaseModel) -> bytes:
    """One JSONL line (without its newline) that ``decode`` reads back as an equal record; ValueError
    when the record holds what JSON cannot say exactly (a non-finite number)."""
    return to_json(record.model_dump()).encode()


R = TypeVar("R", bound=BaseModel)


def decode(line: bytes | str, record: type[R]) -> R:
    """The record ``encode`` wrote; ValueError when the line is not one."""
    return record.model_validate(json.loads(line))


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Context(Record):
    """What the generator is conditioned on: in-context examples, a function seed, a repository."""

    id: str = Field(description="unique within the domain; tasks name it (``context_id``)")
    data: dict[str, Any] = Field(description="what the domain's generator_prompt reads (examples, a seed, a repo)")
    bucket: str | None = Field(None, description="group for progress-aware sampling")
    trace: str | None = Field(
        None,
        description="how the solver did on recently attempted tasks, one line each, set by a sampler (``trace``); "
        "the core shows it at the end of the generator prompt's last user message (``worker.traced``)",
    )


class Validity(Record):
    """W(x): whether a task is usable at all, and why not."""

    valid: bool = Field(description="whether the task parsed and passed every validity predicate")
    reason: str | None = Field(None, description="why not: the step that refused and its words (``parse: ...``)")

    @classmethod
    def ok(cls) -> Validity:
        return cls(valid=True)

    @classmethod
    def reject(cls, reason: str) -> Validity:
        return cls(valid=False, reason=reason)


class Task(Record):
    """One generated task, valid or not."""

    id: str = Field(description="unique within the run (``t000012``; ``rl-STEP-I`` in training)")
    domain: str = Field(description="the registered name of the domain that parsed it")
    context_id: str = Field(description="the context the generator was prompted with")
    generation: str = Field(description="the generator's raw output")
    payload: dict[str, Any] | None = Field(None, description="the parsed task; null when parsing failed")
    text: str | list[str] | None = Field(
        None, description="the task as the reference model reads it: one text, or a trajectory's turns"
    )
    validity: Validity = Field(description="W(x): whether it is usable at all, and why not")
    topic: str | None = Field(None, description="the domain's topic of the payload (for diversity counts)")
    generator: str = Field(description="model id of the generator that wrote it")


class SolverAttempt(Record):
    """One solver attempt at a task, graded."""

    text: str = Field(description="the solver's whole reply (a multi-turn episode's transcript)")
    solved: bool | None = Field(description="null when the attempt could not be graded")
    reason: str | None = Field(None, description="why it failed or could not be graded")
    diagnostics: dict[str, Any] = Field(default_factory=dict, description="format diagnostics")
    retries: list[str] = Field(
        default_factory=list,
        description="why each earlier try could not be graded (the harness failed, e.g. an overloaded machine); "
        "each was run again, and this is the last try",
    )


class Label(Record):
    """The expensive signal: K graded solver attempts and the utility they give."""

    task_id: str = Field(description="the task labeled")
    attempts: list[SolverAttempt] = Field(description="the K attempts, in index order")
    valid_attempts: int = Field(description="how many attempts could be graded")
    solve_rate: float | None = Field(description="solved / graded attempts; null when none could be graded")
    utility: int | None = Field(description="1 in the band, 0 outside, null if too few valid attempts")
    band: tuple[float, float] = Field(description="the band [a, b] the utility was judged against")

    @classmethod
    def from_attempts(
        cls, task_id: str, attempts: list[SolverAttempt], band: tuple[float, float], min_valid: int
    ) -> Label:
        graded = [a.solved for a in attempts if a.solved is not None]
        rate = sum(graded) / len(graded) if graded else None
        utility = None
        if rate is not None and len(graded) >= min_valid:
            utility = int(band[0] <= rate <= band[1])
        return cls(
            task_id=task_id,
            attempts=attempts,
            valid_attempts=len(graded),
            solve_rate=rate,
            utility=utility,
            band=band,
        )


class ProbeBundle(Record):
    """The description (``probe.json``) of a saved probe; weights live in ``probe.safetensors``."""

    model_config = ConfigDict(extra="ignore")  # bundles of older versions carry fields since dropped

    reference_model: str
    #: the reference model's settings the activations were read with (a ``ModelConfig`` dump, all but
    #: sampling); the scorer loads the reference with them
    reference: dict[str, Any] = Field(default_factory=dict)
    #: where the reference's weights come from (``propel_core.embedded.model_source``)
    reference_source: str | None = None
    layer: int
    pooling: str
    architecture: str
    input_dim: int
    max_length: int
    turn_vector: str = "mean_full"
    temperature: float = 1.0
    metrics: dict[str, float] = Field(default_factory=dict)
    training_rows: int
    #: a ranker's logit on the verifier's scale: ``slope``, ``intercept`` of the least-squares line
    #: fitted on its training items, clipped to their scores' range [``low``, ``high``]
    calibration: dict[str, float] | None = None
    #: the lowest logit (temperature applied) the probe gives any labeled task of the corpus it was
    #: trained on (every labeled task is valid): a reward paid in logits pays invalid and cut-off
    #: generations below it (``RewardConfig.settled``)
    lowest_valid_logit: float | None = None


def iter_jsonl(path: str | Path, record: type[R]) -> Iterator[R]:
    """Every complete record of a JSONL file, in order (none when it does not exist); a torn final line
    (from a crash) is skipped."""
    path = Path(path)
    if not path.exists():
        return
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            if not line.endswith(b"\n"):
                return  # torn by a crash mid-write
            if line.strip():
                try:
                    yield decode(line, record)
                except (ValueError, RecursionError) as exc:
                    raise PropelError(f"{path}:{number}: not a valid {record.__name__} record: {exc}") from None


def keep_entries(log_path: Path, keep: Callable[[dict], bool]) -> None:
    """Keep the entries of a JSONL log that ``keep`` accepts; a line torn by a kill (or one ``keep``
    cannot read) goes. The file is replaced whole, so a kill meanwhile leaves the old one or the new."""
    if not log_path.exists():
        return
    kept = []
    for line in log_path.read_text().splitlines():
        try:
            if keep(json.loads(line)):
                kept.append(line)
        except (ValueError, KeyError):  # a line torn by the kill
            continue
    replace_whole(log_path, "".join(line + "\n" for line in kept).encode())


def put_in_order(path: str | Path, record: type[R], key: Callable[[R], Any]) -> None:
    """Rewrite ``path`` whole with its records in ``key`` order, the lines themselves untouched, so a
    file written as threads finished holds the same bytes in every run of one seed (a file already in
    order, or absent, is left alone; a torn last line, from a crash, is dropped as readers drop it),
    replaced whole."""
    path = Path(path)
    if not path.exists():
        return
    data = path.read_bytes()
    lines = [line + b"\n" for line in data[: data.rfind(b"\n") + 1].split(b"\n") if line.strip()]
    ordered = sorted(lines, key=lambda line: key(decode(line, record)))
    if not data or (ordered == lines and data.endswith(b"\n")):
        return
    replace_whole(path, b"".join(ordered))


def replace_whole(path: Path, data: bytes) -> None:
    """``path`` holds ``data``, whole or not at all: written beside it, on disk, then moved over it, so a
    kill or a crash meanwhile leaves the old file or the new one. What a writer killed meanwhile left
    beside it (``NAME.PID.tmp``, its process gone) is removed by the next write of ``path``, so a
    resumed run's folder holds what an uninterrupted one does."""
    for left in path.parent.glob(f"{glob.escape(path.name)}.*.tmp"):
        pid = left.name[len(path.name) + 1 : -len(".tmp")]
        if pid.isdigit() and not _alive(int(pid)):
            left.unlink(missing_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with partial.open("wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class JsonlWriter:
    """Appends records (or a log's plain entries) to a JSONL file, one whole flushed line each; cuts
    off a torn tail first. A write that fails (a full disk) is undone, so the file keeps every earlier
    record and no partial line, and an OSError opening or writing the file becomes a PropelError
    naming it. A record the codec cannot write exactly costs that record alone: it is skipped with a
    warning, and ``write`` says False."""

    def __init__(self, path: str | Path, fsync: bool = True):
        self.path = Path(path)
        self.fsync = fsync
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _cut_torn_tail(self.path)
            self._file = self.path.open("ab", buffering=0)  # unbuffered: nothing left to flush on close
            self._size = os.fstat(self._file.fileno()).st_size
        except OSError as exc:
            raise file_error(exc.filename or self.path, exc) from None

    def write(self, record: BaseModel | dict[str, Any]) -> bool:
        """Append ``record`` (a record, or a log's plain entry)."""
        try:
            data = record.model_dump() if isinstance(record, BaseModel) else record
            line = memoryview(to_json(data).encode() + b"\n")
        except Exception as exc:  # whatever an entry's values do when read, it costs that entry alone
            log.warning("%s: a %s entry was not written: %s", self.path.name, type(record).__name__, exc)
            return False
        try:
            written = 0
            while written < len(line):
                written += self._file.write(line[written:])
            if self.fsync:
                os.fsync(self._file.fileno())
        except OSError as exc:
            with contextlib.suppress(OSError):
                self._file.truncate(self._size)  # no partial line: the file ends after the last whole record
            raise file_error(self.path, exc) from None
        self._size += len(line)
        return True

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cut_torn_tail(path: Path) -> None:
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return
    with path.open("r+b") as f:
        f.truncate(data.rfind(b"\n") + 1)
