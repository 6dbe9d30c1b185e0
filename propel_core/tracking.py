"""Tracking: what each stage measures, sent to the experiment trackers ``report_to`` names.

One setting for the whole run (``report_to: tensorboard``, or a list): the trainers (train, coevolve,
solve-train, self-train) get it as TRL's ``report_to``, and every other stage that measures something
(generate's funnel, label's in-band counts and solve-count histogram, the probe sweep and the selected
probe, evaluate's arms, rank) logs it here, under ``STAGE/metric``, with the run folder's name as the
run name. ``tensorboard`` writes event files to ``RUN/tensorboard/STAGE/`` (``tensorboard --logdir
RUN`` shows them beside the trainers' ``RUN/train/runs/``); ``wandb`` and ``trackio`` log to the
project ``propel``.
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from propel_core.errors import PropelError
from propel_core.records import readable

#: the project wandb and trackio log to
PROJECT = "propel"
#: the pip package each tracker needs
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}


class Tracker:
    """Logs a stage's numbers (and tables) to each tracker of ``report_to``; a no-op for ``none``."""

    def __init__(self, report_to: Sequence[str], run_dir: Path):
        self.trackers = [name for name in report_to if name != "none"]
        for tracker in self.trackers:  # before any work, not after hours of it
            if importlib.util.find_spec(tracker) is None:
                raise _missing(tracker)
        self.run_dir, self.name = Path(run_dir), Path(run_dir).name
        if "tensorboard" in self.trackers and readable(str(self.run_dir)) != str(self.run_dir):
            raise PropelError(f"tensorboard cannot write to {readable(str(self.run_dir))}: its name is not valid UTF-8")
        self._writers: dict[str, Any] = {}
        self._runs: dict[str, Any] = {}

    def trainer_arguments(self, name: str) -> dict[str, Any]:
        """What a TRL trainer's config needs to report to the same trackers: ``report_to``, the run
        name ``name`` and the project (wandb reads its project from the environment)."""
        if "wandb" in self.trackers:
            os.environ.setdefault("WANDB_PROJECT", PROJECT)
        return {"report_to": self.trackers or "none", "run_name": name, "project": PROJECT}

    def log(self, stage: str, metrics: Mapping[str, Any], step: int = 0) -> None:
        """Every finite number of ``metrics`` as ``STAGE/key``."""
        numbers = {
            readable(f"{stage}/{key}"): float(value)
            for key, value in metrics.items()
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        }
        if not numbers:
            return
        for tracker in self.trackers:
            if tracker == "tensorboard":
                writer = self._writer(stage)
                for key, value in numbers.items():
                    writer.add_scalar(key, value, step)
                writer.flush()
            else:
                self._run(tracker).log({**numbers, f"{stage}/step": step})

    def table(self, stage: str, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """A table (the probe sweep): a Markdown text in tensorboard, a table in wandb and trackio."""
        if not rows:
            return
        columns, name = list(rows[0]), readable(f"{stage}/{name}")
        for tracker in self.trackers:
            if tracker == "tensorboard":
                lines = ["| " + " | ".join(readable(columns)) + " |", "|---" * len(columns) + "|"]
                lines += ["| " + " | ".join(_cell(row[c]) for c in columns) + " |" for row in rows]
                writer = self._writer(stage)
                writer.add_text(name, "\n".join(lines), 0)
                writer.flush()
            else:
                data = [[readable(row[c]) for c in columns] for row in rows]
                table = __import__(tracker).Table(columns=readable(columns), data=data)
                self._run(tracker).log({name: table})

    def _writer(self, stage: str):
        if stage not in self._writers:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise _missing("tensorboard") from None
            self._writers[stage] = SummaryWriter(log_dir=str(self.run_dir / "tensorboard" / stage))
        return self._writers[stage]

    def _run(self, tracker: str):
        """This tracker's own run object (not the module's current run, which a trainer replaces
        and finishes)."""
        if tracker not in self._runs:
            module = __import__(tracker)
            if tracker == "wandb":
                self._runs[tracker] = module.init(
                    project=PROJECT, name=self.name, dir=str(self.run_dir), reinit="create_new"
                )
            else:
                self._runs[tracker] = module.init(project=PROJECT, name=self.name)
        return self._runs[tracker]

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()


def _cell(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else readable(str(value))


def _missing(tracker: str) -> PropelError:
    return PropelError(
        f"report_to names {tracker}, which is not installed: pip install {PACKAGES[tracker]} "
        "(or leave it out of report_to)"
    )
