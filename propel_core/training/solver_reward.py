"""The solver's reward in solve-train: the verifier's grade of each rollout, or a reward model's score
in the steps that use one, and the verified rollouts written as a corpus the ranker can read."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from propel_core.contracts import ContextSampler, RewardRule
from propel_core.domain import Domain
from propel_core.errors import PropelError
from propel_core.ranks import is_main
from propel_core.records import Context, JsonlWriter, Label, SolverAttempt, Task, Validity, encode
from propel_core.training.feedback import FeedsBack, Stall, generations, logged_steps
from propel_core.training.replay import ReplayBuffer

if TYPE_CHECKING:
    pass


class SolverRewards(FeedsBack):
    """The reward of a solver's rollouts in ``solve-train``, and RM-GRPO's schedule (the ML-engineering RL study).

    Steps come in cycles of ``verifier_steps`` verifier-scored steps, then ``model_steps`` steps
    scored by ``reward_model`` (a calibrated ranker bundle). On a verifier step every rollout is
    graded by the domain through ``grade`` (the run's executor); it earns ``rule`` of its verdict's
    ``markers`` and ``verifier_score`` (the ML-engineering RL study's partial instrumentation), or without a rule 1
    when solved, else 0. On a model step a rollout the domain says ``looks_valid`` earns the reward
    model's calibrated score of task and rollout; the others earn the rule's reward for a run that
    reached no marker (nothing ran). Every rollout's reward source is written to
    ``folder/rollouts.jsonl`` and every step's numbers (valid-submission rate, mean verifier score,
    seconds per rollout, verifier calls made and saved) to ``folder/reward_log.jsonl`` and ``track``.
    """

    __name__ = "solver_reward"  # TRL names the reward column after the function

    def __init__(
        self,
        domain: Domain,
        tasks: list[Task],
        grade: Callable[[list[tuple[Task, str]]], list[Any]],
        folder: Path,
        *,
        rule: RewardRule | None = None,
        reward_model: Any = None,
        verifier_steps: int = 1,
        model_steps: int = 0,
        sampler: ContextSampler | None = None,
        contexts: dict[str, Context] | None = None,
        replay: ReplayBuffer | None = None,
        track: Callable[[dict[str, Any], int], None] | None = None,
        group_size: int | None = None,
        max_completion_length: int | None = None,
    ):
        if rule is not None and not rule.needs <= {"markers", "verifier_score"}:
            raise PropelError(
                f"solve-train gives a reward rule the verdict's markers and verifier_score only; this rule needs "
                f"{sorted(rule.needs)}: use partial_instrumentation, or none (1 when solved, else 0)"
            )
        if model_steps and reward_model is None:
            raise PropelError("RM-GRPO model steps need a reward model (solve_train.reward_model)")
        if model_steps and reward_model.bundle.calibration is None:
            raise PropelError(
                "the reward model has no calibration onto the verifier's scale: train it with `propel rank "
                "rank.items=attempts`"
            )
        self.domain, self.tasks, self.grade, self.rule = domain, tasks, grade, rule
        self.reward_model, self.cycle = reward_model, (verifier_steps, model_steps)
        self.sampler, self.contexts, self.replay, self.track = sampler, contexts or {}, replay, track
        self.rollouts, self.log_path = folder / "rollouts.jsonl", folder / "reward_log.jsonl"
        self.calls = 0
        self.stall = Stall("solve_train", group_size, max_completion_length)
        self.verifier_calls = self.verifier_calls_saved = 0
        logged = logged_steps(self.log_path)
        self.stall.resume(logged)
        if logged:  # a resumed run (its log cut back to whole steps before it) goes on counting
            last = logged[-1]
            self.verifier_calls, self.verifier_calls_saved = last["verifier_calls"], last["verifier_calls_saved"]

    def source(self, step: int) -> str:
        """Who scores step ``step``: the verifier for the first ``verifier_steps`` of each cycle."""
        verifier_steps, model_steps = self.cycle
        return "verifier" if step % (verifier_steps + model_steps) < verifier_steps else "reward_model"

    def __call__(
        self, prompts, completions, context_id, prefill=None, completion_ids=None, trainer_state=None, **_
    ) -> list[float]:
        step = self.step(trainer_state)
        started = time.monotonic()
        texts = generations(prompts, completions, prefill)
        tasks = [self.tasks[int(i)] for i in context_id]
        if self.source(step) == "verifier":
            graded = self.grade(list(zip(tasks, texts, strict=True)))
            rewards = self.verified(graded)
            sources = ["verifier"] * len(texts)
            details = [attempt.diagnostics | {"solved": attempt.solved, "reason": attempt.reason} for attempt in graded]
        else:
            graded = None
            looks = [self.domain.looks_valid(task.payload, text) for task, text in zip(tasks, texts, strict=True)]
            scored = iter(self.model_scores([(t, x) for t, x, ok in zip(tasks, texts, looks, strict=True) if ok]))
            rewards = [next(scored) if ok else self.unrun() for ok in looks]
            sources = ["reward_model" if ok else "not run" for ok in looks]
            details = [{} for _ in texts]
        replayed = self.offer_replays(step, prompts, completions, completion_ids, rewards)
        whole, own = self.whole_step(
            rewards,
            replayed,
            task_ids=[task.id for task in tasks],
            texts=texts,
            sources=sources,
            details=details,
            graded=graded or [],
            cut=self.stall.cut_off(completion_ids, completions),
            contexts=list(context_id),
            seconds=[time.monotonic() - started],
        )
        if graded is None:
            self.verifier_calls_saved += len(whole["texts"])
        else:
            self.verifier_calls += len(whole["graded"])
        if is_main():
            self.write(step, whole)
        self.log(step, whole, own, graded is not None)
        return rewards

    def verified(self, graded: list[SolverAttempt]) -> list[float]:
        """Graded rollouts' rewards: ``rule`` of each one's markers and verifier score, or 1 when solved.
        A rollout the grader could not grade (the sandbox failed, not the policy) gets the mean of
        the others, so it pushes the policy neither way."""
        rewards = {i: self.graded_reward(attempt) for i, attempt in enumerate(graded) if attempt.solved is not None}
        neutral = statistics.fmean(rewards.values()) if rewards else 0.0
        return [rewards.get(i, neutral) for i in range(len(graded))]

    def graded_reward(self, attempt: SolverAttempt) -> float:
        if self.rule is None:
            return 1.0 if attempt.solved else 0.0
        score = attempt.diagnostics.get("verifier_score")
        validity = Validity.ok() if score is not None else Validity.reject(attempt.reason or "invalid")
        markers = len(attempt.diagnostics.get("markers", ()))
        return self.rule(_rollout(attempt.text, validity), {"markers": markers, "verifier_score": score})

    def unrun(self) -> float:
        """The reward of a rollout that reached no marker (on a model step: it does not look valid)."""
        if self.rule is None:
            return 0.0
        return self.rule(_rollout("", Validity.reject("does not look valid")), {"markers": 0})

    def model_scores(self, rollouts: list[tuple[Task, str]]) -> list[float]:
        """The reward model's calibrated scores of task text and rollout, as the ranker read its pairs."""
        if not rollouts:
            return []
        scores = self.reward_model.score([f"{task.text}\n\n{text}" for task, text in rollouts])
        return [score["calibrated"] for score in scores]

    def write(self, step: int, whole: dict[str, list]) -> None:
        """The step's rollouts (every process's: ``whole``), a line each, to ``rollouts.jsonl``."""
        rows = zip(whole["task_ids"], whole["texts"], whole["rewards"], whole["sources"], whole["details"], strict=True)
        with JsonlWriter(self.rollouts, fsync=False) as out:
            for task_id, text, reward, source, found in rows:
                row = {"step": step, "task_id": task_id, "source": source, "reward": reward, "text": text}
                out.write(row | {key: found.get(key) for key in ROLLOUT_FIELDS})

    def log(self, step: int, whole: dict[str, list], own: slice, verified: bool) -> None:
        """The step's numbers over ``whole`` (every process's rollouts): reward mean and spread, where
        rewards came from, seconds per rollout (the slowest process's time over all rollouts), and on
        ``verified`` steps the valid-submission rate, the mean verifier score of valid rollouts, the
        solved rate (and what ``write_log`` adds: groups of one reward, completions cut off, the alarm)."""
        rewards, sources, graded = whole["rewards"], whole["sources"], whole["graded"]
        entry: dict[str, Any] = {
            "step": step,
            "source": self.source(step),
            "reward_mean": statistics.fmean(rewards),
            "reward_std": statistics.pstdev(rewards),
            "sources": {name: sources.count(name) for name in sorted(set(sources))},
            "verifier_calls": self.verifier_calls,
            "verifier_calls_saved": self.verifier_calls_saved,
            "seconds_per_rollout": max(whole["seconds"]) / len(rewards),
        }
        if verified:
            gradable = [a for a in graded if a.solved is not None]
            scores = [
                a.diagnostics["verifier_score"] for a in gradable if a.diagnostics.get("verifier_score") is not None
            ]
            entry |= {
                "valid_rate": len(scores) / len(gradable) if gradable else None,
                "verifier_score_mean": statistics.fmean(scores) if scores else None,
                "solved_rate": sum(bool(a.solved) for a in gradable) / len(gradable) if gradable else None,
                "ungradable": len(graded) - len(gradable),
            }
        self.write_log(entry, whole, own)
        if self.track is not None:
            self.track({k: v for k, v in entry.items() if isinstance(v, int | float) and k != "step"}, step)


#: what each line of ``rollouts.jsonl`` keeps of a verdict (its grade, then its diagnostics)
ROLLOUT_FIELDS = ("solved", "reason", "markers", "verifier_score", "metric_value", "duration", "status")


def _rollout(text: str, validity: Validity) -> Task:
    """A solver rollout as the reward rules read a generation: its text and whether it is valid."""
    return Task(id="rollout", domain="", context_id="", generation=text, generator="solver", validity=validity)


def verified_corpus(folder: Path, tasks: list[Task], band: tuple[float, float]) -> Path:
    """The verifier-scored rollouts of ``folder/rollouts.jsonl`` as a labeled corpus in
    ``folder/verified/`` (``tasks.jsonl`` and ``labels.jsonl``, one label per task holding its
    rollouts as attempts), which ``propel rank rank.items=attempts`` refreshes a ranker on."""
    out = folder / "verified"
    out.mkdir(exist_ok=True)
    by_task: dict[str, list[SolverAttempt]] = {}
    for line in (folder / "rollouts.jsonl").read_text().splitlines():
        row = json.loads(line) if line.strip() else None
        if row is None or row["source"] != "verifier":
            continue
        diagnostics = {key: row.get(key) for key in ROLLOUT_FIELDS[2:]}
        attempt = SolverAttempt(text=row["text"], solved=row["solved"], reason=row["reason"], diagnostics=diagnostics)
        by_task.setdefault(row["task_id"], []).append(attempt)
    kept = [task for task in tasks if task.id in by_task]
    (out / "tasks.jsonl").write_bytes(b"".join(encode(task) + b"\n" for task in kept))
    labels = [Label.from_attempts(task.id, by_task[task.id], band, min_valid=1) for task in kept]
    (out / "labels.jsonl").write_bytes(b"".join(encode(label) + b"\n" for label in labels))
    return out
