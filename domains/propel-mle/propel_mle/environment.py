"""The instrumented environment: run a solution in the sandbox, then score its submission outside it.

A rollout is one sandboxed run of ``harness.py`` around the solution, in a fresh copy of the task's
public folder (``train.csv``, ``test.csv``). The markers a run reached are read back from the
harness's marker file and from the submission itself:

==================  ===================================================================  ==========
marker              reached when                                                          seen by
==================  ===================================================================  ==========
imports             numpy, pandas, scipy or scikit-learn was imported                     audit hook
data loaded         ``train.csv`` was opened for reading                                  audit hook
model defined       an object with ``fit`` and ``predict``/``transform`` was constructed  profiler
fit                 a ``fit``-like method ran                                             profiler
predict             a ``predict``-like method ran                                         profiler
submission written  ``submission.csv`` exists in the solution's folder after the run      verifier
schema valid        it has the header ``id,TARGET`` and one row per test id, values ok     verifier
finite score        the held-out metric of it is a finite number                          verifier
==================  ===================================================================  ==========

The first five are recorded inside the solution's process, which the solution controls: it can
append to the marker file itself. That forgery is bounded: it can lift an invalid rollout's reward
by at most ``partial_step`` per in-process marker (0.5 with the ML-engineering RL study's 0.1), and every invalid
reward stays below every valid one: an invalid rollout reaches at most seven markers (no finite
score), ``-10 + 0.1 * 7 = -9.3``, and the lowest verifier score is -1. The last three are the
verifier's, from the file the run left and labels the sandbox never saw.
"""

from __future__ import annotations

import csv
import io
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from propel_core import PropelError
from propel_mle.datasets import METRICS, Split

MARKERS = (
    "imports",
    "data loaded",
    "model defined",
    "fit",
    "predict",
    "submission written",
    "schema valid",
    "finite score",
)
IN_PROCESS = MARKERS[:5]
HARNESS = Path(__file__).with_name("harness.py")
WORKDIR = "/work"
MARKER_FILE = "/propel-out/markers"
SUBMISSION = "submission.csv"
MAX_SUBMISSION_BYTES = 4 << 20
# a submission is bounded by the test set before any row is built: an id and a number take well
# under BYTES_PER_ROW bytes, and beside the header and one line per id only a few blank lines fit
BYTES_PER_ROW = 64
SPARE_LINES = 3
# one thread per numerical library: the address-space limit binds every thread's stack and buffers
COMMAND = (
    "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1 "
    f"exec python -B harness.py solution.py {MARKER_FILE}"
)


@dataclass
class Rollout:
    """What one execution of a solution did: the markers it reached (in ``MARKERS`` order), its
    verifier score (None unless the submission is valid and its metric finite), the raw metric, how
    the sandboxed run ended, and how long execution plus scoring took."""

    markers: list[str] = field(default_factory=list)
    verifier_score: float | None = None
    metric_value: float | None = None
    status: str = "ok"
    reason: str | None = None
    duration: float = 0.0

    @property
    def valid(self) -> bool:
        return self.verifier_score is not None


def execute(sandbox, folder: Path, code: str, split: Split, target: str, metric: str, time_limit: float) -> Rollout:
    """Run ``code`` on the task whose public files are in ``folder`` and score what it submitted."""
    started = time.monotonic()
    rollout = Rollout()
    with sandbox.workspace(path=folder, workdir=WORKDIR) as workspace:
        workspace.write("harness.py", HARNESS.read_bytes())
        workspace.write("solution.py", code.encode())
        result = workspace.run(COMMAND, time_limit=time_limit)
        rollout.status = result.status
        if result.status not in ("ok", "error"):
            rollout.reason = f"{result.status}: {result.detail}"
        elif result.status == "error":
            rollout.reason = "the solution failed: " + (_last_line(result.stderr) or str(result.detail))
        reached = set((_read(workspace, MARKER_FILE, 4096) or b"").decode(errors="replace").split("\n"))
        submission = _read(workspace, f"{WORKDIR}/{SUBMISSION}", MAX_SUBMISSION_BYTES + 1)
    if result.status == "sandbox_error":  # our failure, not the solution's: nothing to grade
        rollout.duration = time.monotonic() - started
        return rollout
    rollout.markers = [name for name in IN_PROCESS if name in reached]
    if submission is not None:
        rollout.markers.append("submission written")
        predictions, problem = read_submission(submission, split, target, metric)
        if problem is None:
            rollout.markers.append("schema valid")
            rollout.metric_value, rollout.verifier_score = score(predictions, split, metric)
            if rollout.verifier_score is not None:
                rollout.markers.append("finite score")
            else:
                problem = f"its {metric} is not a finite number"
        rollout.reason = rollout.reason or (f"submission: {problem}" if problem else None)
    else:
        rollout.reason = rollout.reason or f"no {SUBMISSION} written"
    rollout.duration = time.monotonic() - started
    return rollout


def _read(workspace, path: str, limit: int) -> bytes | None:
    """The file at ``path`` in the workspace, or None when there is none (or it is no regular file)."""
    try:
        return workspace.read(path, limit)
    except (OSError, PropelError):
        return None


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def read_submission(data: bytes, split: Split, target: str, metric: str) -> tuple[list[float] | None, str | None]:
    """The predictions in test-file order, or why the submission breaks the schema: UTF-8 CSV, the
    header ``id,TARGET``, one row per test id and no other, a finite number per row (for a
    classification target, one of the training classes, unless the metric reads probabilities)."""
    limit = min(MAX_SUBMISSION_BYTES, BYTES_PER_ROW * (len(split.ids) + 1))
    if len(data) > limit:
        return None, f"larger than {limit} bytes ({BYTES_PER_ROW} a row of the test set's {len(split.ids)})"
    if data.count(b"\n") > len(split.ids) + SPARE_LINES:
        return None, f"more than {len(split.ids) + SPARE_LINES} lines for {len(split.ids)} test ids"
    try:
        rows = list(csv.reader(io.StringIO(data.decode("utf-8"))))
    except (UnicodeDecodeError, csv.Error) as exc:
        return None, f"not a UTF-8 CSV file ({str(exc)[:100]})"
    if not rows or [cell.strip() for cell in rows[0]] != ["id", target]:
        return None, f"the header must be 'id,{target}'"
    found: dict[int, float] = {}
    for number, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != 2:
            return None, f"line {number} has {len(row)} fields, not 2"
        try:
            key, value = int(row[0]), float(row[1])
        except ValueError:
            return None, f"line {number} is not an id and a number"
        if not math.isfinite(value):
            return None, f"line {number} predicts {row[1]!r}"
        if split.classes is not None and metric != "auc" and value not in split.classes:
            return None, f"line {number} predicts {row[1]!r}, not one of the classes {list(split.classes)}"
        if key in found:
            return None, f"id {key} appears twice"
        found[key] = value
    missing = len(set(split.ids) - set(found))
    if missing or len(found) != len(split.ids):
        return None, f"{missing} test ids missing, {len(set(found) - set(split.ids))} unknown ids"
    return [found[key] for key in split.ids], None


def score(predictions: list[float], split: Split, metric: str) -> tuple[float | None, float | None]:
    """The raw metric of ``predictions`` against the held-out labels, and the verifier score: the
    metric itself, or for rmse the skill ``1 - RMSE / sd(held-out target)`` floored at -1."""
    import numpy as np
    from sklearn import metrics

    truth = np.asarray(split.labels)
    guess = np.asarray(predictions)
    low, high = METRICS[metric]
    if metric == "rmse":
        value = float(np.sqrt(np.mean((guess - truth) ** 2)))
        skill = 1.0 - value / max(float(truth.std()), 1e-12)
        result = value, max(low, skill)
    elif metric == "auc":
        value = float(metrics.roc_auc_score(truth == max(split.classes), guess))
        result = value, value
    elif metric == "accuracy":
        value = float(metrics.accuracy_score(truth, guess))
        result = value, value
    else:
        value = float(metrics.f1_score(truth, guess, average="macro"))
        result = value, value
    if not all(math.isfinite(v) for v in result):
        return result[0], None
    return result[0], min(high, result[1])
