"""The reward scorer: the RL reward of generated tasks, from validity and probe scores, with no solver.

Plugged into TRL's GRPOTrainer as a reward function. Each call parses the batch's completions into
tasks, runs the domain's validity predicates, scores the rendered tasks with the probe bundle(s)
through the frozen reference model (one truncated forward pass per batch; the reference is a
separate model instance that is never the policy and never receives gradients), and applies the
configured reward rule. A completion cut off at the length limit gets ``reward.overflow_reward``.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from propel_core.backend import prefill as prompt_prefill
from propel_core.config import RewardConfig, TrainConfig
from propel_core.contracts import ContextSampler, RewardRule, reads_probe
from propel_core.domain import Domain, make_task
from propel_core.errors import PropelError
from propel_core.probes.bundles import ProbeScorer, load_probe
from propel_core.provenance import folder_digest
from propel_core.records import Context, Label, SolverAttempt, Task, Validity, encode, to_json
from propel_core.replay import ReplayBuffer

if TYPE_CHECKING:
    from propel_core.run import Run


#: completions kept per reward call (``completions.jsonl``), and the characters kept of each
SAMPLED, SAMPLED_CHARS = 4, 4000
COMPLETIONS = "completions.jsonl"

#: the settings a reward reading live solver utility depends on (it labels as the label stage does)
SOLVER_KEYS = ("solver", "label.k", "label.band_low", "label.band_high", "label.min_valid_attempts")


def _text(completion) -> str:
    return completion if isinstance(completion, str) else completion[-1]["content"]


def _generations(prompts, completions, prefill) -> list[str]:
    """Each completion after the prefill its prompt ended with: the whole text the model wrote."""
    starts = prefill or [prompt_prefill(prompt) for prompt in prompts]
    return [start + _text(completion) for start, completion in zip(starts, completions, strict=True)]


class FeedsBack:
    """What every reward function of a GRPO run gives back once it has scored a batch, whatever it
    scores with: the rewards to the context sampler (``sampler``, by ``contexts``), the fresh
    generations to the replay buffer (``replay``), and what both did to the step's log entry
    (``log_path``). ``calls`` numbers the calls where TRL gives no trainer state."""

    sampler: ContextSampler | None
    contexts: dict[str, Context]
    replay: ReplayBuffer | None
    log_path: Path | None
    calls: int

    def step(self, trainer_state) -> int:
        """The optimizer step this call scores for (and count the call)."""
        self.calls += 1
        return trainer_state.global_step if trainer_state is not None else self.calls - 1

    def feed_back(self, step: int, prompts, completions, completion_ids, context_id, rewards: list[float]) -> int:
        """Give the batch's rewards to the sampler and its fresh generations to the replay buffer; the
        number of replays in the batch."""
        if self.sampler is not None and context_id:
            self.sampler.update([self.contexts[c] for c in context_id], rewards)
        if self.replay is None or completion_ids is None:
            return 0
        return self.replay.offer(step, prompts, completions, completion_ids, rewards)

    def write_log(self, entry: dict[str, Any], replayed: int) -> None:
        """Add the replay buffer's and the sampler's numbers to ``entry`` and append it to the log."""
        if self.replay is not None:
            entry |= {"replayed": replayed, "replay_admitted": self.replay.admitted}
        if self.sampler is not None and hasattr(self.sampler, "diagnostics"):
            entry["sampler"] = self.sampler.diagnostics()
        if self.log_path is not None:
            with self.log_path.open("a") as handle:
                handle.write(to_json(entry) + "\n")


class RewardScorer(FeedsBack):
    """The reward function GRPO calls: ``rule`` on each generation's task and the scores it needs.

    ``probes`` are the loaded bundles (main first); ``solve`` labels valid tasks with live solver
    runs, for a rule whose ``needs`` holds ``solver_utility``. A completion of
    ``max_completion_length`` tokens or more gets ``overflow_reward``. With ``sampler`` the contexts'
    rewards go back to it; with ``replay`` fresh generations are offered to the buffer; with
    ``log_path`` each call appends its diagnostics there (groups of ``group_size``), under the rule's
    name and options (``rule_name``, ``rule_options``), and a sample of its completions with their
    rewards to ``completions.jsonl`` beside it.
    """

    def __init__(
        self,
        domain: Domain,
        rule: RewardRule,
        probes: list[ProbeScorer] = (),
        *,
        rule_name: str,
        rule_options: dict[str, Any],
        overflow_reward: float,
        max_completion_length: int,
        group_size: int,
        solve: Callable[[list[Task]], list[Label]] | None = None,
        log_path: Path | None = None,
        sampler: ContextSampler | None = None,
        replay: ReplayBuffer | None = None,
    ):
        self.domain, self.rule, self.probes, self.needs = domain, rule, list(probes), rule.needs
        self.rule_name, self.rule_options = rule_name, dict(rule_options)
        self.__name__ = rule_name  # TRL names the reward's metrics after it: rewards/<rule>/mean
        if domain.registry is None:
            raise PropelError("the reward scorer needs a domain built by a registry (Registry.domain)")
        self.predicates = domain.registry.validity_predicates(domain)
        self.contexts = {context.id: context for context in domain.contexts()}
        if reads_probe(rule) and not self.probes:
            raise PropelError("the reward rule reads probe scores, but no probe bundle was given")
        if "solver_utility" in self.needs and solve is None:
            raise PropelError("the reward rule reads live solver utility, but no solver was given")
        self.overflow_reward, self.max_completion_length = overflow_reward, max_completion_length
        self.group_size, self.solve = group_size, solve
        self.log_path = log_path
        self.sampler, self.replay = sampler, replay
        self.calls = 0
        self.solver_attempts = 0  # solver runs of the last call (solver_in_the_loop)

    def __call__(
        self,
        prompts,
        completions,
        context_id=None,
        completion_ids=None,
        trainer_state=None,
        prefill=None,
        generation=None,
        **_,
    ) -> list[float]:
        """``generation``: a multi-turn domain's whole trajectories (from the episode rollouts), which
        replace prefill + completion as what the task is parsed from."""
        step = self.step(trainer_state)
        texts = generation or _generations(prompts, completions, prefill)
        tasks = [self.task(i, step, text, context_id) for i, text in enumerate(texts)]
        scores = self.scores(tasks)
        overflowed = [ids is not None and len(ids) >= self.max_completion_length for ids in completion_ids or []]
        overflowed = overflowed or [False] * len(tasks)
        rewards = [
            self.overflow_reward if overflowed[i] else self.rule(task, scores[i]) for i, task in enumerate(tasks)
        ]
        replayed = self.feed_back(step, prompts, completions, completion_ids, context_id, rewards)
        self.log(step, tasks, rewards, scores, replayed)
        if self.log_path is not None:
            with self.log_path.with_name(COMPLETIONS).open("a") as handle:
                handle.write(to_json(self.sample(step, tasks, rewards, scores, overflowed)) + "\n")
        return rewards

    def task(self, i: int, step: int, generation: str, context_ids) -> Task:
        """The task that generation ``i`` of this step is."""
        context = self.contexts.get(context_ids[i]) if context_ids else None
        context = context or Context(id="unknown", data={})
        return make_task(f"rl-{step}-{i}", self.domain, context, generation, "policy", self.predicates)

    def scores(self, tasks: list[Task]) -> list[dict[str, Any]]:
        """The scores the rule needs: probe scores of every task the reference can read (valid or not:
        probe_only needs both), the live solver utility and the domain's verifier score of every valid
        task, the number of workflow markers every generation reached."""
        out: list[dict[str, Any]] = [{} for _ in tasks]
        if reads_probe(self.rule):
            self.probe_scores(tasks, out)
        if "solver_utility" in self.needs:
            for i, utility in self.solver_utilities(tasks).items():
                out[i]["solver_utility"] = utility
        for i, task in enumerate(tasks):
            if "markers" in self.needs:
                out[i]["markers"] = len(self.domain.markers_reached(task.generation))
            if "verifier_score" in self.needs and task.validity.valid:
                score = self.domain.verifier_score(task.payload)
                if score is None:
                    raise PropelError(
                        f"domain {self.domain.name!r} gives no verifier score; set reward.options."
                        "partial_instrumentation.valid_score to one of logit, probability, solver_utility"
                    )
                out[i]["verifier_score"] = score
        return out

    def solver_utilities(self, tasks: list[Task]) -> dict[int, float]:
        """Utility from K real solver attempts per valid task, graded as the label stage does."""
        position = {task.id: i for i, task in enumerate(tasks)}
        labels = self.solve([task for task in tasks if task.validity.valid])
        self.solver_attempts = sum(len(label.attempts) for label in labels)
        return {position[label.task_id]: float(label.utility or 0) for label in labels}  # too few gradable: 0

    def probe_scores(self, tasks: list[Task], out: list[dict[str, Any]]) -> None:
        readable = [i for i, task in enumerate(tasks) if task.text is not None]
        if not readable:
            return
        per_probe = [probe.score([tasks[i].text for i in readable]) for probe in self.probes]
        for position, i in enumerate(readable):
            main = per_probe[0][position]
            out[i] = {
                "logit": main["logit"],
                "probability": main["probability"],
                "ensemble_logits": [scored[position]["logit"] for scored in per_probe],
            }
            if len(per_probe) > 1:
                out[i]["auxiliary_logit"] = per_probe[1][position]["logit"]

    def log(self, step: int, tasks: list[Task], rewards: list[float], scores: list[dict], replayed: int = 0) -> None:
        """Reward mean/std, validity rate, degenerate groups (all rewards equal), probe score spread,
        and the solver runs the call spent when the rule reads live solver utility."""
        group = self.group_size
        groups = [rewards[i : i + group] for i in range(0, len(rewards), group)]
        probabilities = [s["probability"] for s in scores if "probability" in s]
        entry = {
            "step": step,
            "reward_mean": statistics.fmean(rewards),
            "reward_std": statistics.pstdev(rewards),
            "validity_rate": sum(task.validity.valid for task in tasks) / len(tasks),
            "degenerate_groups": sum(len(set(g)) == 1 for g in groups) / len(groups),
            "probe_probability_mean": statistics.fmean(probabilities) if probabilities else None,
            "probe_probability_std": statistics.pstdev(probabilities) if probabilities else None,
        }
        if "solver_utility" in self.needs:
            entry["solver_attempts"] = self.solver_attempts
        entry |= {"rule": self.rule_name, "rule_options": self.rule_options}
        self.write_log(entry, replayed)

    def sample(self, step: int, tasks: list[Task], rewards: list[float], scores: list[dict], overflowed: list[bool]):
        """``SAMPLED`` of the call's completions, spread over the batch, with their rewards (and whether
        each hit the length limit, which earns ``overflow_reward`` whatever the rule says)."""
        every = max(1, len(tasks) // SAMPLED)
        return {
            "step": step,
            "rule": self.rule_name,
            "completions": [
                {
                    "generation": tasks[i].generation[:SAMPLED_CHARS],
                    "reward": rewards[i],
                    "valid": tasks[i].validity.valid,
                    "reason": tasks[i].validity.reason,
                    "probability": scores[i].get("probability"),
                    "overflow": overflowed[i],
                }
                for i in range(0, len(tasks), every)[:SAMPLED]
            ],
        }


def main_probe(run: Run, reward: RewardConfig) -> Path:
    """The probe bundle the rule reads: ``reward.main_probe``, else the run's selected one."""
    return Path(reward.main_probe) if reward.main_probe else run.dir / "probes" / "selected"


def reward_reads(run: Run, reward: RewardConfig) -> tuple[tuple[str, ...], dict[str, Any]]:
    """What a training's reward depends on beyond its ``reward.*`` settings, for ``RUN/settings.json``:
    the config keys (the rule's own options; the solver's and the label stage's, for a rule reading
    live solver utility) and the content of each probe bundle the rule reads (whatever its path)."""
    rule = run.registry.reward_rule(reward.rule, reward)
    keys = (f"reward.options.{reward.rule}", *(SOLVER_KEYS if "solver_utility" in rule.needs else ()))
    bundles = [main_probe(run, reward), *map(Path, reward.probes)] if reads_probe(rule) else []
    return keys, {"reward.bundles": [folder_digest(bundle) for bundle in bundles]}


def reward_scorer(
    run: Run,
    reward: RewardConfig,
    train: TrainConfig,
    main_probe: Path,
    solve: Callable[[list[Task]], list[Label]] | None = None,
    **options: Any,
) -> RewardScorer:
    """The reward function GRPO gets under ``reward`` (rule and extra probes) and ``train`` (length
    limit, group size): the rule built once, and the probe bundles (``main_probe`` first, then
    ``reward.probes``) loaded only when the rule reads them. ``options``: ``log_path``, ``sampler``,
    ``replay``."""
    rule = run.registry.reward_rule(reward.rule, reward)
    probes = []
    if reads_probe(rule):
        if not (Path(main_probe) / "probe.json").exists():
            raise PropelError(f"no probe bundle in {main_probe}: run `propel probe` first")
        probes = [load_probe(path, run.registry) for path in [main_probe, *reward.probes]]
    return RewardScorer(
        run.domain(),
        rule,
        probes,
        rule_name=reward.rule,
        rule_options=reward.options.get(reward.rule, {}),
        overflow_reward=reward.overflow_reward,
        max_completion_length=train.max_completion_length,
        group_size=train.group_size,
        solve=solve,
        **options,
    )


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
        self.verifier_calls = self.verifier_calls_saved = 0
        logged = self.log_path.read_text().splitlines() if self.log_path.exists() else []
        if logged:  # a resumed run (its log cut back to whole steps before it) goes on counting
            last = json.loads(logged[-1])
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
        texts = _generations(prompts, completions, prefill)
        tasks = [self.tasks[int(i)] for i in context_id]
        if self.source(step) == "verifier":
            graded = self.grade(list(zip(tasks, texts, strict=True)))
            self.verifier_calls += len(graded)
            rewards = self.verified(graded)
            sources = ["verifier"] * len(texts)
            details = [attempt.diagnostics | {"solved": attempt.solved, "reason": attempt.reason} for attempt in graded]
        else:
            graded = None
            looks = [self.domain.looks_valid(task.payload, text) for task, text in zip(tasks, texts, strict=True)]
            scored = iter(self.model_scores([(t, x) for t, x, ok in zip(tasks, texts, looks, strict=True) if ok]))
            rewards = [next(scored) if ok else self.unrun() for ok in looks]
            sources = ["reward_model" if ok else "not run" for ok in looks]
            self.verifier_calls_saved += len(texts)
            details = [{} for _ in texts]
        replayed = self.feed_back(step, prompts, completions, completion_ids, context_id, rewards)
        self.write(step, tasks, texts, rewards, sources, details)
        self.log(step, rewards, sources, graded, replayed, time.monotonic() - started)
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

    def write(self, step, tasks, texts, rewards, sources, details) -> None:
        with self.rollouts.open("a") as handle:
            for task, text, reward, source, found in zip(tasks, texts, rewards, sources, details, strict=True):
                row = {"step": step, "task_id": task.id, "source": source, "reward": reward, "text": text}
                handle.write(to_json(row | {key: found.get(key) for key in ROLLOUT_FIELDS}) + "\n")

    def log(self, step, rewards, sources, graded, replayed: int, seconds: float) -> None:
        """This step's numbers: reward mean and spread, where rewards came from, and on verifier steps
        the valid-submission rate, the mean verifier score of valid rollouts, seconds per rollout."""
        entry: dict[str, Any] = {
            "step": step,
            "source": self.source(step),
            "reward_mean": statistics.fmean(rewards),
            "reward_std": statistics.pstdev(rewards),
            "sources": {name: sources.count(name) for name in sorted(set(sources))},
            "verifier_calls": self.verifier_calls,
            "verifier_calls_saved": self.verifier_calls_saved,
            "seconds_per_rollout": seconds / len(rewards),
        }
        if graded is not None:
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
        self.write_log(entry, replayed)
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
