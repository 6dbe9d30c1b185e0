"""The pipeline stages, in the order ``propel run`` runs them.

Each stage is ``stage(run: Run) -> None``: it reads the previous stage's files from the run folder and
writes its own, so any stage can be rerun or resumed alone. Each gets a CLI verb of its name, and so
does each follow-up.
"""

from __future__ import annotations

from collections.abc import Callable

from propel_core.run import Run
from propel_core.stages.coevolve import coevolve
from propel_core.stages.evaluate import evaluate
from propel_core.stages.extract import extract
from propel_core.stages.generate import generate
from propel_core.stages.label import label
from propel_core.stages.probe import probe
from propel_core.stages.rank import rank
from propel_core.stages.report import report
from propel_core.stages.solve import self_train, solve_train
from propel_core.stages.train import train

STAGES: dict[str, Callable[[Run], None]] = {
    "generate": generate,
    "label": label,
    "extract": extract,
    "probe": probe,
    "train": train,
    "evaluate": evaluate,
    "report": report,
}

#: stages with a CLI verb that ``propel run`` leaves out: they need a finished run to start from
FOLLOW_UPS: dict[str, Callable[[Run], None]] = {
    "coevolve": coevolve,
    "rank": rank,
    "solve-train": solve_train,
    "self-train": self_train,
}
