"""The pipeline stages, in the order ``propel run`` runs them.

Each stage is ``stage(run: Run) -> None``: it reads the previous stage's files from the run folder and
writes its own, so any stage can be rerun or resumed alone. Each gets a CLI verb of its name.
"""

from __future__ import annotations

from collections.abc import Callable

from propel_core.run import Run
from propel_core.stages.extract import extract
from propel_core.stages.generate import generate
from propel_core.stages.label import label
from propel_core.stages.probe import probe
from propel_core.stages.train import train

STAGES: dict[str, Callable[[Run], None]] = {
    "generate": generate,
    "label": label,
    "extract": extract,
    "probe": probe,
    "train": train,
}
