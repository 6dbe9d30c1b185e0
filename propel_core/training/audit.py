"""The audit: real solver labels of the policy's own tasks while the generator trains.

Every ``train.audit.every`` steps the reward function hands the step's tasks to :class:`Audit`, which
draws a seeded sample, journals it, and labels it with K real solver attempts (through the run's
executor, as the label stage does) on a thread of its own: the GRPO loop does not wait. When the
labels arrive, the audit records what they say at the step they describe: the real in-band rate and
utility against the probe's mean probability (the calibration gap), the probe's AUROC and balanced
accuracy on those tasks, diversity, and the trials and seconds spent. It keeps the adapter of the
step with the best audited utility, and it can stop training (``audit.stop_gap``,
``audit.stop_drop``) with one line that says why.

Files, in the training folder: ``audit/tasks.jsonl`` (each sampled task, journaled before it is
labeled), ``audit/labels.jsonl`` (its label), ``audit.jsonl`` (one record per audit; an audit whose
solver failed records its error), ``audit/step-S/`` (the adapter that wrote step S's tasks, while its
audit is pending) and ``best_audited/`` (the adapter with the best audited utility, with its record).
Every reader skips a line torn by a kill.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from propel_core.config import AuditConfig
from propel_core.evaluation import arm_metrics
from propel_core.execution import solver_labels
from propel_core.probes.metrics import auc, balanced_accuracy
from propel_core.records import JsonlWriter, Label, Task, iter_jsonl, keep_entries, to_json

if TYPE_CHECKING:
    from propel_core.plans import AuditPlan
    from propel_core.services import Services

log = logging.getLogger("propel")

BEST = "best_audited"
#: audits waiting at most; one due while this many wait is skipped, so a slow solver cannot pile up
#: adapter snapshots and a long wait at the end
WAITING = 2


class Audit:
    """Background audits of a generator in training (``train.audit``), recorded in ``folder``.

    ``solve`` labels tasks as the label stage does (K attempts each, through the executor);
    ``seed`` draws each step's sample; ``track(metrics, step)`` sends a record to the run's
    trackers. :meth:`start` is called once the training knows the step it starts from.
    """

    def __init__(
        self,
        options: AuditConfig,
        folder: Path,
        solve: Callable[[list[Task]], list[Label]],
        seed: int,
        track: Callable[[dict, int], None] | None = None,
    ):
        self.options, self.folder, self.solve, self.seed = options, folder, solve, seed
        self.track = track
        self.records_path = folder / "audit.jsonl"
        self.journal = folder / "audit"
        self.lock = threading.Lock()
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit")  # audits run in order
        self.pending: dict[int, Future] = {}
        self.records: list[dict] = []
        self.stop_reason: str | None = None
        self.stopped_at: int | None = None

    def start(self, resume_step: int) -> None:
        """Training starts at ``resume_step`` (0, or the checkpoint it goes on from): audits of that
        step and later, which training redoes, are dropped with their snapshots (and ``best_audited``
        if it was one of them); earlier ones that never finished (the process died while they ran)
        run again from their journaled tasks. A stop rule the kept audits meet holds again."""
        self.journal.mkdir(parents=True, exist_ok=True)
        keep_entries(self.records_path, lambda record: record["step"] < resume_step)
        self.records = _records(self.records_path)
        keep_entries(self.journal / "tasks.jsonl", lambda task: _step_of(task["id"]) < resume_step)
        keep_entries(self.journal / "labels.jsonl", lambda label: _step_of(label["task_id"]) < resume_step)
        done = {r["step"] for r in self.records}
        for leftover in [*self.journal.glob("step-*"), *self.journal.glob("probabilities-*.json")]:
            step = int(leftover.name.split("-")[1].split(".")[0])
            if step >= resume_step or step in done:
                _remove(leftover)
        best = self.folder / BEST / "audit.json"
        if best.exists() and json.loads(best.read_text())["step"] >= resume_step:
            shutil.rmtree(self.folder / BEST)
            log.warning("the best audited adapter was of a step this training redoes; the next audits choose again")
        self._check_stop()
        self._resubmit(done)

    # -- what training calls ----------------------------------------------------------------------

    def due(self, step: int) -> bool:
        return (
            step % self.options.every == 0 and step not in self.pending and all(r["step"] != step for r in self.records)
        )

    def offer(self, step: int, tasks: list[Task], probabilities: list[float | None]) -> None:
        """Step ``step``'s tasks and their probe probabilities: sample, journal and label them in the
        background when an audit is due at this step."""
        if not self.due(step):
            return
        if sum(not future.done() for future in self.pending.values()) >= WAITING:
            log.warning("audit of step %d skipped: %d audits are still waiting for the solver", step, WAITING)
            _remove(self.journal / f"step-{step}")
            return
        chosen = sorted(random.Random(f"{self.seed}-audit-{step}").sample(range(len(tasks)), self._count(tasks)))
        kept = []
        with JsonlWriter(self.journal / "tasks.jsonl") as journal:
            kept = [tasks[i] for i in chosen if journal.write(tasks[i])]  # what the journal cannot hold is not audited
        scored = {tasks[i].id: probabilities[i] for i in chosen}
        (self.journal / f"probabilities-{step}.json").write_text(json.dumps(scored))
        self.pending[step] = self.worker.submit(self._audit, step, kept, scored)

    def snapshot(self, step: int, model) -> None:
        """Keep the adapter that writes step ``step``'s tasks, for as long as its audit is pending."""
        if self.due(step):
            model.save_pretrained(str(self.journal / f"step-{step}"))

    def stop_now(self, step: int) -> bool:
        """Whether training stops after ``step`` (an audit met a stop rule); remembers the step."""
        if self.stop_reason and self.stopped_at is None:
            self.stopped_at = step
        return bool(self.stop_reason)

    def close(self, cancel: bool = False) -> None:
        """Wait for the audits in flight (their records are the last word on the final steps); with
        ``cancel`` (training failed), drop the ones that have not started."""
        self.worker.shutdown(wait=True, cancel_futures=cancel)

    # -- the audit itself -----------------------------------------------------------------------------

    def _count(self, tasks: list[Task]) -> int:
        return min(self.options.tasks, len(tasks))

    def _audit(self, step: int, tasks: list[Task], probabilities: dict[str, float | None]) -> None:
        started = time.monotonic()
        try:
            labels = self.solve([task for task in tasks if task.validity.valid])
        except Exception as error:  # the solver failed: recorded, and training goes on
            log.warning("audit of step %d failed: %s", step, error)
            self._record(step, {"step": step, "error": f"{type(error).__name__}: {error}"})
            return
        with JsonlWriter(self.journal / "labels.jsonl") as journal:
            for label in labels:
                journal.write(label)
        record = {"step": step, **audit_metrics(tasks, labels, probabilities), "seconds": time.monotonic() - started}
        self._record(step, record)
        if self.track is not None:
            self.track({f"audit/{key}": value for key, value in record.items() if _number(value)}, step)
        log.info("%s", audit_line(record))

    def _record(self, step: int, record: dict) -> None:
        """Keep the step's adapter if its utility is the best yet, then append the record, then drop
        the snapshot: a kill between any two leaves what a resume repairs (the audit runs again)."""
        with self.lock:
            best = record.get("utility") is not None and all(
                record["utility"] > r["utility"] for r in self.records if r.get("utility") is not None
            )
            snapshot = self.journal / f"step-{step}"
            if best and snapshot.exists():
                _replace(snapshot, self.folder / BEST, record)
            with JsonlWriter(self.records_path) as out:
                out.write(record)
            self.records.append(record)
            _remove(snapshot)
            _remove(self.journal / f"probabilities-{step}.json")
            self._check_stop()

    def _check_stop(self) -> None:
        """Set ``stop_reason`` when the audits so far, in step order, met ``audit.stop_gap`` or
        ``audit.stop_drop`` at any of them (so a resumed training's kept audits stop it again)."""
        records = sorted((r for r in self.records if "error" not in r), key=lambda r: r["step"])
        for end in range(1, len(records) + 1):
            self.stop_reason = self.stop_reason or self._rule_met(records[:end])

    def _rule_met(self, records: list[dict]) -> str | None:
        """Why the audits up to the last of ``records`` stop training, if they do."""
        options = self.options
        last = records[-options.stop_after :]
        gap = options.stop_gap
        off = [r for r in last if r["gap"] is not None and gap is not None and abs(r["gap"]) > gap]
        if len(off) == options.stop_after:
            gaps = ", ".join(f"{r['gap']:+.2f}" for r in last)
            return (
                f"the probe's calibration gap was over audit.stop_gap={gap} in {len(last)} audits in a row "
                f"(steps {last[0]['step']}-{last[-1]['step']}: {gaps})"
            )
        utilities = [r["utility"] for r in records if r["utility"] is not None]
        now = records[-1]["utility"]
        if options.stop_drop is not None and now is not None and max(utilities) - now > options.stop_drop:
            return (
                f"audited utility fell to {now:.3f} at step {records[-1]['step']}, more than "
                f"audit.stop_drop={options.stop_drop} below its best, {max(utilities):.3f}"
            )
        return None

    def _resubmit(self, done: set[int]) -> None:
        """Audits journaled before the resume with no record (the process died while they ran): their
        labels, if any were written, go, and they run again whole."""
        waiting: dict[int, list[Task]] = {}
        for task in iter_jsonl(self.journal / "tasks.jsonl", Task):
            if _step_of(task.id) not in done:
                waiting.setdefault(_step_of(task.id), []).append(task)
        keep_entries(self.journal / "labels.jsonl", lambda label: _step_of(label["task_id"]) not in waiting)
        for step, tasks in sorted(waiting.items()):
            path = self.journal / f"probabilities-{step}.json"
            probabilities = json.loads(path.read_text()) if path.exists() else {}
            self.pending[step] = self.worker.submit(self._audit, step, tasks, probabilities)


def audit_of(
    services: Services, folder: Path, plan: AuditPlan, track: Callable[[dict, int], None] | None = None
) -> Audit:
    """The audit of a training into ``folder``, as ``plan`` says (``train.audit``): its solver labels
    each sample through the run's executor, each step's sample drawn from the labels' seed; ``track``
    gets each audit's metrics."""
    return Audit(plan.options, folder, solver_labels(services, plan.labels), plan.labels.seed, track)


def audited(audit: Audit):
    """The trainer callback of an audit: it keeps the adapter that writes each audited step's tasks
    (at the step's start, before the optimizer moves it) and stops training when an audit says so."""
    from transformers import TrainerCallback

    class Audited(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kwargs):
            audit.snapshot(state.global_step, model)

        def on_step_end(self, args, state, control, **kwargs):
            if audit.stop_now(state.global_step):
                control.should_training_stop = True

    return Audited()


def audit_metrics(tasks: list[Task], labels: list[Label], probabilities: dict[str, float | None]) -> dict:
    """What one audit says: the arm metrics of its tasks (validity, utility, diversity); the real
    in-band rate of its labeled tasks; on those the probe scored, the probe's mean probability minus
    their real in-band rate (the calibration gap: positive when the probe is fooled), and the probe's
    AUROC and balanced accuracy against the real labels."""
    arm = arm_metrics(tasks, labels, max((len(label.attempts) for label in labels), default=0))
    known = [label for label in labels if label.utility is not None]
    probed = [label for label in known if probabilities.get(label.task_id) is not None]
    real = [float(label.utility) for label in probed]
    probe = [float(probabilities[label.task_id]) for label in probed]
    out: dict[str, Any] = {
        "tasks": len(tasks),
        "valid_rate": arm["valid_rate"][0],
        "utility": arm["utility"][0],
        "utility_se": arm["utility"][1],
        "in_band_rate": statistics.fmean(float(label.utility) for label in known) if known else None,
        "probe_probability": statistics.fmean(probe) if probe else None,
        "gap": statistics.fmean(probe) - statistics.fmean(real) if probe else None,
        "auroc": None,
        "balanced_accuracy": None,
        "top_topic_share": None if arm["top_topic_share"] is None else arm["top_topic_share"][0],
        "distinct_3": None if arm["distinct_3"] is None else arm["distinct_3"][0],
        "trials": sum(len(label.attempts) for label in labels),
    }
    if len(set(real)) == 2:  # both classes among the audited tasks
        import torch

        scores, truth = torch.tensor(probe), torch.tensor(real)
        out["auroc"] = auc(truth, scores)
        out["balanced_accuracy"] = balanced_accuracy(truth, scores >= 0.5)
    return out


def read_records(folder: Path) -> list[dict]:
    """A training folder's audit records, by step (lines torn by a kill skipped)."""
    return sorted(_records(folder / "audit.jsonl"), key=lambda record: record["step"])


def _records(path: Path) -> list[dict]:
    """The audit records of a JSONL file (none when it does not exist); a line torn by a kill, or one
    that is not a record with a step, is skipped."""
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):  # else not an audit's record
            out.append(record)
    return out


def _replace(snapshot: Path, target: Path, record: dict) -> None:
    """``target`` becomes a copy of ``snapshot`` with ``record`` beside it, whole or not at all."""
    staging = target.with_name(f"{target.name}.tmp")
    _remove(staging)
    shutil.copytree(snapshot, staging)
    (staging / "audit.json").write_text(to_json(record) + "\n")
    old = target.with_name(f"{target.name}.old")
    _remove(old)
    if target.exists():
        os.replace(target, old)
    os.replace(staging, target)
    _remove(old)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def audit_line(record: dict) -> str:
    """The progress line of one audit: its utility, calibration gap and AUROC, each with three
    decimals, or why there is none (an AUROC needs audited tasks on both sides of the band)."""

    def shown(value: float | None, sign: str = "") -> str:
        return "n/a" if value is None else f"{value:{sign}.3f}"

    auroc = (
        "n/a (no audited tasks on both sides of the band)" if record.get("auroc") is None else shown(record["auroc"])
    )
    return (
        f"audit of step {record['step']}: utility {shown(record['utility'])}, "
        f"calibration gap {shown(record['gap'], '+')}, AUROC {auroc}"
    )


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _step_of(task_id: str) -> int:
    """The step of a task the reward function named ``rl-STEP-I``."""
    return int(task_id.split("-")[1])
