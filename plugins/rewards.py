"""Reward rules that combine validity with probe scores (paper section 3.3 and appendix 12).

Each rule reads only the scores it needs; a missing or non-finite score is an error, never a silent
reward.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Literal

from propel_core import RewardConfig, RewardError, Task, hookimpl

Rule = Callable[[Task, Mapping[str, object]], float]


@hookimpl
def register_reward_rules(register):
    register("hard", hard)
    register("soft", soft)
    register("probe_only", probe_only)
    register("wco", wco)
    register("adversarial", adversarial)
    register("solver_in_the_loop", solver_in_the_loop)
    register("partial_instrumentation", partial_instrumentation)


def _score(scores: Mapping[str, object], key: str) -> float:
    if key not in scores:
        raise RewardError(f"this reward rule needs the score {key!r}; got {sorted(scores)}")
    return _finite(key, scores[key])


def _finite(key: str, value: object) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise RewardError(f"score {key!r} is {value}; the probe produced a non-finite output")
    return value


def _gated(config: RewardConfig, valid_reward: Callable[[Mapping[str, object]], float], *needs: str) -> Rule:
    """Invalid tasks get r_bad; valid ones get ``valid_reward(scores)``, which reads the scores ``needs``."""

    def rule(task: Task, scores: Mapping[str, object]) -> float:
        if task.validity.valid:
            return valid_reward(scores)
        if config.r_bad is None:
            raise RewardError("reward.r_bad is not settled: build the rule on RewardConfig.settled(...)")
        return config.r_bad

    rule.needs = frozenset(needs)
    return rule


def hard(config: RewardConfig) -> Rule:
    """R_hard: r_bad if invalid, else the raw probe logit."""
    return _gated(config, lambda scores: _score(scores, "logit"), "logit")


def soft(config: RewardConfig, clip_low: float = 0.1, clip_high: float = 0.95) -> Rule:
    """r_bad if invalid, else the probe probability clipped to [clip_low, clip_high] (its options)."""
    return _gated(config, lambda scores: min(max(_score(scores, "probability"), clip_low), clip_high), "probability")


def probe_only(config: RewardConfig) -> Rule:
    """The probe probability, with no validity gate."""

    def rule(task: Task, scores: Mapping[str, object]) -> float:
        return _score(scores, "probability")

    rule.needs = frozenset({"probability"})
    return rule


def wco(config: RewardConfig) -> Rule:
    """R_WCO: r_bad if invalid, else the minimum logit over an ensemble of probes."""

    def worst_case(scores: Mapping[str, object]) -> float:
        logits = scores.get("ensemble_logits")
        if not logits:
            raise RewardError("the wco rule needs 'ensemble_logits' from at least one probe")
        return min(_finite("ensemble_logits", value) for value in logits)

    return _gated(config, worst_case, "ensemble_logits")


def adversarial(config: RewardConfig) -> Rule:
    """r_bad if invalid, else min(main probe logit, auxiliary probe logit) (co-evolution)."""
    return _gated(
        config,
        lambda scores: min(_score(scores, "logit"), _score(scores, "auxiliary_logit")),
        "logit",
        "auxiliary_logit",
    )


def solver_in_the_loop(config: RewardConfig) -> Rule:
    """The paper's SIL baseline: r_bad if invalid, else the real utility (1 in band, 0 outside) from
    K live solver attempts; no probe. It exists to measure what the probe saves."""
    return _gated(config, lambda scores: _score(scores, "solver_utility"), "solver_utility")


def partial_instrumentation(
    config: RewardConfig,
    partial_base: float = -10.0,
    partial_step: float = 0.1,
    valid_score: Literal["verifier_score", "logit", "probability", "solver_utility"] = "verifier_score",
) -> Rule:
    """The ML-engineering RL study's partial-credit reward, with its own options
    (``reward.options.partial_instrumentation``): a valid task with a finite ``valid_score`` (the
    domain's ``verifier_score``, or the probe's ``logit`` or ``probability``, or live
    ``solver_utility``) earns that score; any other generation earns ``partial_base + partial_step *
    (workflow markers it reached)``, so a policy that writes no valid task yet still sees which
    generations got further."""

    def rule(task: Task, scores: Mapping[str, object]) -> float:
        value = scores.get(valid_score)
        if task.validity.valid and value is not None and math.isfinite(float(value)):
            return float(value)
        return partial_base + partial_step * _score(scores, "markers")

    rule.needs = frozenset({"markers", valid_score})
    return rule
