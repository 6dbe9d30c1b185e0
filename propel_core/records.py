"""Typed records shared by all stages, and the JSONL files they live in.

Stage files are JSON Lines a user can open in any editor: one record a line, each line written whole
and flushed, so a crash leaves at most one torn final line, which readers skip and writers cut off
before appending. A write that fails (a full disk) is cut back at once and reported as a PropelError
naming the file.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from propel_core.errors import PropelError, file_error


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Context(Record):
    """What the generator is conditioned on: in-context examples, a function seed, a repository."""

    id: str
    data: dict[str, Any]
    bucket: str | None = Field(None, description="group for progress-aware sampling")


class Validity(Record):
    """W(x): whether a task is usable at all, and why not."""

    valid: bool
    reason: str | None = None

    @classmethod
    def ok(cls) -> Validity:
        return cls(valid=True)

    @classmethod
    def reject(cls, reason: str) -> Validity:
        return cls(valid=False, reason=reason)


class Task(Record):
    """One generated task, valid or not."""

    id: str
    domain: str
    context_id: str
    generation: str = Field(description="the generator's raw output")
    payload: dict[str, Any] | None = Field(None, description="the parsed task; null when parsing failed")
    text: str | list[str] | None = Field(
        None, description="the task as the reference model reads it: one text, or a trajectory's turns"
    )
    validity: Validity
    topic: str | None = None
    generator: str = Field(description="model id of the generator that wrote it")


class SolverAttempt(Record):
    """One solver attempt at a task, graded."""

    text: str
    solved: bool | None = Field(description="null when the attempt could not be graded")
    reason: str | None = Field(None, description="why it failed or could not be graded")
    diagnostics: dict[str, Any] = Field(default_factory=dict, description="format diagnostics")


class Label(Record):
    """The expensive signal: K graded solver attempts and the utility they give."""

    task_id: str
    attempts: list[SolverAttempt]
    valid_attempts: int
    solve_rate: float | None
    utility: int | None = Field(description="1 in the band, 0 outside, null if too few valid attempts")
    band: tuple[float, float]

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


R = TypeVar("R", bound=BaseModel)


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
                    yield record.model_validate_json(line)
                except ValueError as exc:
                    raise PropelError(f"{path}:{number}: not a valid {record.__name__} record: {exc}") from None


class JsonlWriter:
    """Appends records to a JSONL file, one whole flushed line each; cuts off a torn tail first. A write
    that fails (a full disk) is undone, so the file keeps every earlier record and no partial line, and
    an OSError opening or writing the file becomes a PropelError naming it."""

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

    def write(self, record: BaseModel) -> None:
        line = memoryview(record.model_dump_json().encode() + b"\n")
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
