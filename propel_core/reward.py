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
from pathlib import Path
from typing import Any

from propel_core.backend import prefill
from propel_core.domain import label_task, make_task
from propel_core.errors import PropelError
from propel_core.probes import ProbeScorer
from propel_core.records import Context, Task

PROBE_SCORES = frozenset({"logit", "probability"})


def reads_probe(rule) -> bool:
    """Whether a reward rule reads probe scores: a rule without ``needs`` reads the probe's."""
    return bool(getattr(rule, "needs", PROBE_SCORES) - {"solver_utility"})


class RewardScorer:
    __name__ = "probe_reward"  # TRL names the reward column after the function

    def __init__(self, run, probes: list[ProbeScorer], log_path: Path | None = None):
        self.config, self.domain = run.config, run.domain()
        self.run = run
        self.rule = run.component("reward_rules", self.config.reward.rule)(self.config.reward)
        self.predicates = {name: run.component("validity_predicates", name) for name in self.domain.validity_predicates}
        self.contexts = {context.id: context for context in self.domain.contexts()}
        self.probes = probes
        self.needs = getattr(self.rule, "needs", PROBE_SCORES)
        if reads_probe(self.rule) and not probes:
            raise PropelError(
                f"reward rule {self.config.reward.rule!r} reads probe scores, but no probe bundle was given"
            )
        self.log_path = log_path
        self.calls = 0

    def __call__(
        self, prompts, completions, context_id=None, completion_ids=None, trainer_state=None, **_
    ) -> list[float]:
        step = trainer_state.global_step if trainer_state is not None else self.calls
        self.calls += 1
        tasks = [
            self.task(i, step, prompt, completion, context_id)
            for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True))
        ]
        scores = self.scores(tasks)
        limit = self.config.train.max_completion_length
        rewards = []
        for i, task in enumerate(tasks):
            if completion_ids is not None and len(completion_ids[i]) >= limit:
                rewards.append(self.config.reward.overflow_reward)
            else:
                rewards.append(self.rule(task, scores[i]))
        self.log(step, tasks, rewards, scores)
        return rewards

    @property
    def solver(self):
        return self.run.backend("solver")

    def task(self, i: int, step: int, prompt, completion, context_ids) -> Task:
        text = completion if isinstance(completion, str) else completion[-1]["content"]
        context = self.contexts.get(context_ids[i]) if context_ids else None
        context = context or Context(id="unknown", data={})
        return make_task(f"rl-{step}-{i}", self.domain, context, prefill(prompt) + text, "policy", self.predicates)

    def scores(self, tasks: list[Task]) -> list[dict[str, Any]]:
        """The scores the rule needs: probe scores of every task the reference can read (valid or not:
        probe_only needs both), and/or the live solver utility of every valid task."""
        out: list[dict[str, Any]] = [{} for _ in tasks]
        if "solver_utility" in self.needs:
            for i, utility in self.solver_utilities(tasks).items():
                out[i]["solver_utility"] = utility
        if reads_probe(self.rule):
            self.probe_scores(tasks, out)
        return out

    def solver_utilities(self, tasks: list[Task]) -> dict[int, float]:
        """Utility from K real solver attempts per valid task, graded as the label stage does."""
        valid = [i for i, task in enumerate(tasks) if task.validity.valid]
        if not valid:
            return {}
        prompts = [self.domain.solver_prompt(tasks[i].payload) for i in valid]
        attempts = self.solver.generate(prompts, self.config.solver.sampling, n=self.config.label.k)
        labels = [
            label_task(self.domain, tasks[i], texts, self.config.label)
            for i, texts in zip(valid, attempts, strict=True)
        ]
        return {i: float(label.utility or 0) for i, label in zip(valid, labels, strict=True)}  # too few gradable: 0

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

    def log(self, step: int, tasks: list[Task], rewards: list[float], scores: list[dict]) -> None:
        """Reward mean/std, validity rate, degenerate groups (all rewards equal), probe score spread."""
        group = self.config.train.group_size
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
        if self.log_path is not None:
            with self.log_path.open("a") as handle:
                handle.write(json.dumps(entry) + "\n")
