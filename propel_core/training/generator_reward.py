"""The generator's reward: the RL reward of generated tasks, from validity and probe scores, with no solver.

Plugged into TRL's GRPOTrainer as a reward function. Each call parses the batch's completions into
tasks, runs the domain's validity predicates, scores the rendered tasks with the probe bundle(s)
through the frozen reference model (one truncated forward pass per batch; the reference is a
separate model instance that is never the policy and never receives gradients), and applies the
configured reward rule. A completion cut off at the length limit gets ``reward.overflow_reward``.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from propel_core.config import RewardConfig, TrainConfig
from propel_core.contracts import ContextSampler, RewardRule, paid_in_logits, reads_probe
from propel_core.domain import Domain, make_task
from propel_core.errors import PropelError
from propel_core.probes.bundles import ProbeScorer, load_probe, read_bundle
from propel_core.provenance import folder_digest
from propel_core.ranks import is_main, process_index
from propel_core.records import Context, JsonlWriter, Label, Task
from propel_core.training.feedback import FeedsBack, Stall, generations
from propel_core.training.replay import ReplayBuffer

if TYPE_CHECKING:
    from propel_core.services import Services
    from propel_core.training.audit import Audit


log = logging.getLogger("propel")

#: completions kept per reward call (``completions.jsonl``), and the characters kept of each
SAMPLED, SAMPLED_CHARS = 4, 4000


COMPLETIONS = "completions.jsonl"


#: the settings a reward reading live solver utility depends on (it labels as the label stage does)
SOLVER_KEYS = ("solver", "label.k", "label.band_low", "label.band_high", "label.min_valid_attempts")


class RewardScorer(FeedsBack):
    """The reward function GRPO calls: ``rule`` on each generation's task and the scores it needs.

    ``probes`` are the loaded bundles (main first); ``solve`` labels valid tasks with live solver
    runs, for a rule whose ``needs`` holds ``solver_utility``. Each completion ends at its first
    ``stop`` string; one the length limit cut off (``max_completion_length`` tokens, ended by neither
    an end token nor a stop string) is an invalid task, as in generate, and gets ``overflow_reward``;
    ``r_bad`` is what ``rule`` pays other invalid tasks (logged beside it). With ``sampler`` the contexts'
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
        r_bad: float,
        overflow_reward: float,
        max_completion_length: int,
        group_size: int,
        stop: list[str] = (),
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
        self.r_bad, self.overflow_reward, self.max_completion_length = r_bad, overflow_reward, max_completion_length
        self.group_size, self.solve = group_size, solve
        self.stall = Stall("train", group_size, max_completion_length, stop)
        self.log_path = log_path
        self.sampler, self.replay = sampler, replay
        self.calls = 0
        self.solver_attempts = 0  # solver runs of the last call (solver_in_the_loop)
        self.audit: Audit | None = None  # train.audit: offered the tasks of every step

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
        texts = generation or generations(prompts, completions, prefill, self.stall.stop)
        overflowed = self.stall.cut_off(completion_ids, completions) or [False] * len(texts)
        first = process_index() * len(texts)  # TRL gives every process a batch of one size
        tasks = [
            self.task(first + i, step, text, context_id[i] if context_id else None, overflowed[i])
            for i, text in enumerate(texts)
        ]
        scores = self.scores(tasks)
        rewards = [
            self.overflow_reward if overflowed[i] else self.rule(task, scores[i]) for i, task in enumerate(tasks)
        ]
        replayed = self.offer_replays(step, prompts, completions, completion_ids, rewards)
        whole, own = self.whole_step(
            rewards,
            replayed,
            tasks=tasks,
            scores=scores,
            overflowed=overflowed,
            cut=overflowed if completion_ids else [],  # the alarm's: unknown without token ids
            contexts=list(context_id or []),
            attempts=[self.solver_attempts],
        )
        if self.audit is not None and not self.draw:  # the main process's: it audits the step's batch
            self.audit.offer(step, whole["tasks"], [score.get("probability") for score in whole["scores"]])
        self.log(step, whole, own)
        if self.log_path is not None and is_main():
            with JsonlWriter(self.log_path.with_name(COMPLETIONS), fsync=False) as out:
                out.write(self.sample(step, whole["tasks"], whole["rewards"], whole["scores"], whole["overflowed"]))
        return rewards

    def task(self, i: int, step: int, generation: str, context_id: str | None, cut_off: bool) -> Task:
        """The task that generation ``i`` of this step (counted over every process of a launch) is, from
        ``context_id`` (invalid where the length limit ``cut_off`` it, as in generate); ``rl-STEP-i``, or
        ``rl-STEP-refillK-i`` in the step's K-th further draw of prompts (``zero_variance: refill``)."""
        context = self.contexts.get(context_id) if context_id else None
        context = context or Context(id="unknown", data={})
        draw = f"-refill{self.draw}" if self.draw else ""
        return make_task(f"rl-{step}{draw}-{i}", self.domain, context, generation, "policy", self.predicates, cut_off)

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

    def log(self, step: int, whole: dict[str, list], own: slice) -> None:
        """The step's reward mean/std, validity rate, probe score spread, and the solver runs it spent
        when the rule reads live solver utility, over ``whole`` (every process's completions; see
        ``whole_step``), and what ``write_log`` adds: degenerate groups, where all rewards are equal,
        completions cut off at the length limit, the alarm."""
        rewards, tasks = whole["rewards"], whole["tasks"]
        probabilities = [s["probability"] for s in whole["scores"] if "probability" in s]
        entry = {
            "step": step,
            "reward_mean": statistics.fmean(rewards),
            "reward_std": statistics.pstdev(rewards),
            "validity_rate": sum(task.validity.valid for task in tasks) / len(tasks),
            "probe_probability_mean": statistics.fmean(probabilities) if probabilities else None,
            "probe_probability_std": statistics.pstdev(probabilities) if probabilities else None,
        }
        if "solver_utility" in self.needs:
            entry["solver_attempts"] = sum(whole["attempts"])
        entry |= {
            "rule": self.rule_name,
            "rule_options": self.rule_options,
            "r_bad": self.r_bad,
            "overflow_reward": self.overflow_reward,
        }
        self.write_log(entry, whole, own)

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


def main_probe(services: Services, reward: RewardConfig) -> Path:
    """The probe bundle the rule reads: ``reward.main_probe``, else the run's selected one."""
    return Path(reward.main_probe) if reward.main_probe else services.dir / "probes" / "selected"


def settled_reward(services: Services, reward: RewardConfig, bundles: list[Path], quiet: bool = False) -> RewardConfig:
    """``reward`` with r_bad and the overflow reward it leaves null set (``RewardConfig.settled``): for a
    rule paid in logits, below the lowest logit any bundle it reads a logit of gives a valid labeled
    task (``bundles``: main first, then ``reward.probes``; see ``logit_bundles``). An explicit r_bad
    above that logit is kept, with a warning (unless ``quiet``: a check before the training that will
    say it): invalid tasks then earn more than some valid ones."""
    rule = rule_of(services, reward)
    if not paid_in_logits(rule):
        return reward.settled(False, None)
    unset = reward.r_bad is None or reward.overflow_reward is None
    read = logit_bundles(rule.needs, [Path(bundle) for bundle in bundles])
    missing = [bundle for bundle in read if not (bundle / "probe.json").exists()]
    if missing and unset:
        raise PropelError(f"no probe bundle in {missing[0]}: run `propel probe` first")
    if missing:  # nothing to calibrate: the scorer refuses the missing bundle itself
        return reward
    lowest = [read_bundle(bundle).lowest_valid_logit for bundle in read]
    known = [logit for logit in lowest if logit is not None]
    if not quiet and reward.r_bad is not None and known and reward.r_bad > min(known):
        log.warning(
            "reward.r_bad %s is above the lowest logit %s the probe gives a valid labeled task: an invalid task "
            "earns more than some valid ones (left null, it is calibrated below them: docs/config.md)",
            reward.r_bad,
            min(known),
        )
    if not unset:
        return reward
    unknown = [str(bundle) for bundle, logit in zip(read, lowest, strict=True) if logit is None]
    return reward.settled(True, None if unknown else min(lowest), f"the probe bundle {', '.join(unknown)}")


def logit_bundles(needs: frozenset[str], bundles: list[Path]) -> list[Path]:
    """The bundles whose logits a rule reading ``needs`` pays: the main one for ``logit``, the first of
    ``reward.probes`` for ``auxiliary_logit``, every one for ``ensemble_logits`` (and for a rule
    registered without ``needs``)."""
    if "ensemble_logits" in needs:
        return bundles
    return [*bundles[:1] * ("logit" in needs), *bundles[1:2] * ("auxiliary_logit" in needs)]


def rule_of(services: Services, reward: RewardConfig) -> RewardRule:
    """The rule ``reward`` names, built to ask what it reads: on settings settled as for a rule not
    paid in logits, since a factory may read r_bad before training has settled it."""
    return services.registry.reward_rule(reward.rule, reward.settled(False, None))


def rule_of_cell(services: Services, reward: RewardConfig) -> Callable[[float], RewardRule]:
    """``rule_at(lowest)``: the rule ``reward`` names as a probe sweep cell's head would be paid by it,
    its r_bad and overflow reward settled below that head's own lowest valid logit where ``reward``
    leaves them null (the probe stage's RVP)."""
    paid = paid_in_logits(rule_of(services, reward))
    return lambda lowest: services.registry.reward_rule(reward.rule, reward.settled(paid, lowest))


def reward_reads(services: Services, reward: RewardConfig) -> tuple[tuple[str, ...], dict[str, Any]]:
    """What a training's reward depends on beyond its ``reward.*`` settings, for ``RUN/settings.json``:
    the config keys (the rule's own options; the solver's and the label stage's, for a rule reading
    live solver utility), the content of each probe bundle the rule reads (whatever its path), and
    the r_bad and overflow reward it pays (calibrated from those bundles where the config leaves them
    null)."""
    rule = rule_of(services, reward)
    keys = (f"reward.options.{reward.rule}", *(SOLVER_KEYS if "solver_utility" in rule.needs else ()))
    bundles = [main_probe(services, reward), *map(Path, reward.probes)] if reads_probe(rule) else []
    try:
        settled = settled_reward(services, reward, bundles, quiet=True)  # the training's scorer warns, once
    except PropelError:  # a bundle missing, or without its lowest logit: the claim refuses a changed setting
        settled = reward  # first, and the scorer refuses the bundle after it
    return keys, {
        "reward.bundles": [folder_digest(bundle) for bundle in bundles],
        "reward.r_bad": settled.r_bad,
        "reward.overflow_reward": settled.overflow_reward,
    }


def reward_scorer(
    services: Services,
    reward: RewardConfig,
    train: TrainConfig,
    main_probe: Path,
    solve: Callable[[list[Task]], list[Label]] | None = None,
    **options: Any,
) -> RewardScorer:
    """The reward function GRPO gets under ``reward`` (rule and extra probes) and ``train`` (length
    limit, group size): the rule, and the probe bundles (``main_probe`` first, then
    ``reward.probes``) loaded only when the rule reads them. ``options``: ``stop``, ``log_path``,
    ``sampler``, ``replay``. R_bad and the overflow reward are settled first (``settled_reward``)."""
    bundles = [main_probe, *map(Path, reward.probes)]
    reward = settled_reward(services, reward, bundles)
    rule = services.registry.reward_rule(reward.rule, reward)
    probes = []
    if reads_probe(rule):
        if not (Path(main_probe) / "probe.json").exists():
            raise PropelError(f"no probe bundle in {main_probe}: run `propel probe` first")
        probes = [load_probe(path, services.registry) for path in bundles]
    return RewardScorer(
        services.domain(),
        rule,
        probes,
        rule_name=reward.rule,
        rule_options=reward.options.get(reward.rule, {}),
        r_bad=reward.r_bad,
        overflow_reward=reward.overflow_reward,
        max_completion_length=train.max_completion_length,
        group_size=train.group_size,
        solve=solve,
        **options,
    )
