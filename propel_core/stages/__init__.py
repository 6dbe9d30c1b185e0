"""The pipeline stages, in the order ``propel run`` runs them.

Each stage is ``stage(run: Run) -> None``: it reads the previous stage's files from the run folder and
writes its own, so any stage can be rerun or resumed alone. Each gets a CLI verb of its name, and so
does each follow-up.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from propel_core.errors import PropelError
from propel_core.provenance import record_refusal, record_time
from propel_core.ranks import DISTRIBUTED_STAGES, is_main, process_count
from propel_core.run import Run
from propel_core.stages.coevolve import coevolve
from propel_core.stages.evaluate import evaluate
from propel_core.stages.extract import extract
from propel_core.stages.generate import generate
from propel_core.stages.label import label
from propel_core.stages.probe import probe
from propel_core.stages.rank import rank
from propel_core.stages.report import report
from propel_core.stages.rounds import rounds
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
    "rounds": rounds,
}


def run_stage(run: Run, name: str) -> None:
    """Run the stage (or follow-up) ``name``; when it refuses (a ``PropelError``: all labels outside
    the band, no valid tasks, a file made with other settings), the reason and the pipeline stages it
    holds up are kept in the run folder for ``propel report`` to show
    (:func:`propel_core.provenance.record_refusal`) before the error goes on; when it finishes, a
    reason kept from before is dropped. However it ends, its wall time is added to the stage's in
    ``RUN/timings.json`` (:func:`propel_core.provenance.record_time`). Under a launch of several
    processes only the ``DISTRIBUTED_STAGES`` run; any other refuses before it starts."""
    if process_count() > 1 and name not in DISTRIBUTED_STAGES:
        raise PropelError(
            f"`propel {name}` runs in one process, and accelerate launch started {process_count()}: run it "
            f"without accelerate launch (a launch of several runs {' and '.join(DISTRIBUTED_STAGES)})"
        )
    started, ended = time.monotonic(), "interrupted"
    try:
        {**STAGES, **FOLLOW_UPS}[name](run)
        ended = "finished"
    except PropelError as exc:
        ended = "refused"
        order = list(STAGES)
        later = tuple(order[order.index(name) + 1 :]) if name in order else ()
        if is_main():  # the main process records refusals for all
            record_refusal(run.dir, name, str(exc), later)
        raise
    except Exception:
        ended = "failed"
        raise
    finally:
        if is_main():
            record_time(run.dir, name, time.monotonic() - started, ended)
    if is_main():
        record_refusal(run.dir, name, None)
