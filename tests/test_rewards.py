"""Reward rules on hand-made inputs."""

import math

import pytest

from propel_core.config import PAPER_OVERFLOW_REWARD, PAPER_R_BAD, R_BAD_MARGIN, RewardConfig
from propel_core.contracts import paid_in_logits
from propel_core.errors import PropelError, RewardError
from propel_core.records import Task, Validity


def task(valid: bool) -> Task:
    return Task(
        id="t",
        domain="d",
        context_id="c",
        generation="g",
        generator="m",
        validity=Validity(valid=valid, reason=None if valid else "bad"),
    )


#: the lowest logit the probe of these tests gives a valid labeled task
LOWEST = -3.0


@pytest.fixture
def rule(propel_registry):
    """A rule as training builds it: its r_bad and overflow reward settled, with a probe whose lowest
    valid logit is LOWEST."""

    def made(name, options=None, **settings):
        config = RewardConfig(**settings, options={name: options or {}})
        paid = paid_in_logits(propel_registry.reward_rule(name, config))
        return propel_registry.reward_rule(name, config.settled(paid, LOWEST))

    return made


def test_hard(rule):
    assert rule("hard")(task(False), {"logit": 3.0}) == LOWEST - R_BAD_MARGIN
    assert rule("hard")(task(True), {"logit": -1.5}) == -1.5
    assert rule("hard", r_bad=-1.0)(task(False), {}) == -1.0


def test_soft_clips(rule):
    soft = rule("soft")
    assert soft(task(True), {"probability": 0.01}) == 0.1
    assert soft(task(True), {"probability": 0.99}) == 0.95
    assert soft(task(True), {"probability": 0.5}) == 0.5
    narrow = rule("soft", {"clip_low": 0.3, "clip_high": 0.6})  # its options, reward.options.soft
    assert [narrow(task(True), {"probability": p}) for p in (0.01, 0.5, 0.99)] == [0.3, 0.5, 0.6]
    assert soft(task(False), {"probability": 0.5}) == -0.2


def test_probe_only_has_no_gate(rule):
    assert rule("probe_only")(task(False), {"probability": 0.7}) == 0.7


def test_wco_takes_the_worst(rule):
    assert rule("wco")(task(True), {"ensemble_logits": [0.5, -2.0, 1.0]}) == -2.0
    assert rule("wco")(task(False), {"ensemble_logits": [0.5]}) == LOWEST - R_BAD_MARGIN
    with pytest.raises(RewardError, match="ensemble_logits"):
        rule("wco")(task(True), {"ensemble_logits": []})


def test_adversarial_is_min_of_main_and_auxiliary(rule):
    assert rule("adversarial")(task(True), {"logit": 1.0, "auxiliary_logit": 0.25}) == 0.25


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize(("name", "key"), [("hard", "logit"), ("soft", "probability"), ("probe_only", "probability")])
def test_non_finite_scores_are_errors(rule, name, key, bad):
    with pytest.raises(RewardError, match="non-finite"):
        rule(name)(task(True), {key: bad})


def test_non_finite_in_ensemble(rule):
    with pytest.raises(RewardError, match="non-finite"):
        rule("wco")(task(True), {"ensemble_logits": [0.1, math.nan]})


def test_missing_score_named(rule):
    with pytest.raises(RewardError, match="needs the score 'logit'"):
        rule("hard")(task(True), {"probability": 0.5})


def test_solver_in_the_loop_uses_the_live_utility(rule):
    sil = rule("solver_in_the_loop")
    assert sil.needs == {"solver_utility"}
    assert sil(task(True), {"solver_utility": 1.0}) == 1.0
    assert sil(task(True), {"solver_utility": 0.0}) == 0.0
    assert sil(task(False), {}) == -0.2
    with pytest.raises(RewardError, match="needs the score 'solver_utility'"):
        sil(task(True), {"logit": 2.0})


def test_partial_instrumentation_gives_invalid_tasks_credit_per_marker(rule):
    partial = rule("partial_instrumentation")
    assert partial(task(False), {"markers": 3}) == pytest.approx(-10 + 0.3)
    assert partial(task(False), {"markers": 0}) == -10
    assert partial(task(True), {"markers": 5, "verifier_score": 0.62}) == 0.62
    # a valid task without a finite score is treated like an invalid one (the ML-engineering RL study)
    assert partial(task(True), {"markers": 5, "verifier_score": math.nan}) == pytest.approx(-9.5)
    chosen = rule("partial_instrumentation", {"valid_score": "logit", "partial_base": -1.0, "partial_step": 0.5})
    assert chosen(task(True), {"markers": 1, "logit": 2.0}) == 2.0
    assert chosen(task(False), {"markers": 1, "logit": 2.0}) == -0.5
    with pytest.raises(RewardError, match="markers"):
        partial(task(False), {})


def test_rules_declare_the_scores_they_need(rule):
    from propel_core.contracts import reads_probe

    assert reads_probe(rule("hard")) and reads_probe(rule("wco"))
    assert not reads_probe(rule("solver_in_the_loop"))
    assert not reads_probe(rule("partial_instrumentation"))
    assert reads_probe(rule("partial_instrumentation", {"valid_score": "probability"}))


def test_countdown_markers_follow_the_validity_funnel(propel_registry):
    countdown = propel_registry.domain("countdown")
    assert countdown.markers_reached("nothing here") == []
    assert countdown.markers_reached("Target: 10") == ["target line"]
    assert countdown.markers_reached("Target: 10\nNumbers: 2, 5") == ["target line", "numbers line", "parsed"]
    assert countdown.markers_reached("Target: 999\nNumbers: 1, 1, 1") == [
        "target line",
        "numbers line",
        "parsed",
        "within the rules",
    ]
    assert countdown.markers_reached("Target: 10\nNumbers: 2, 5, 1") == list(countdown.workflow_markers)


@pytest.mark.parametrize(
    ("name", "paid"),
    [
        ("hard", True),
        ("wco", True),
        ("adversarial", True),
        ("soft", False),
        ("probe_only", False),
        ("solver_in_the_loop", False),
        ("partial_instrumentation", False),
    ],
)
def test_which_rules_are_paid_in_logits(propel_registry, name, paid):
    """The rules whose valid tasks earn a probe logit get an r_bad below the probe's logits; the others
    keep the paper's -0.2 and 0.0, on their own scale."""
    config = RewardConfig()
    assert paid_in_logits(propel_registry.reward_rule(name, config)) is paid
    settled = config.settled(paid, LOWEST)
    expected = (LOWEST - R_BAD_MARGIN,) * 2 if paid else (PAPER_R_BAD, PAPER_OVERFLOW_REWARD)
    assert (settled.r_bad, settled.overflow_reward) == expected


def test_partial_instrumentation_on_logits_is_paid_in_logits(propel_registry):
    config = RewardConfig(options={"partial_instrumentation": {"valid_score": "logit"}})
    assert paid_in_logits(propel_registry.reward_rule("partial_instrumentation", config))


def test_explicit_values_win_over_the_calibration():
    assert RewardConfig(r_bad=-0.5).settled(True, LOWEST).model_dump(include={"r_bad", "overflow_reward"}) == {
        "r_bad": -0.5,
        "overflow_reward": LOWEST - R_BAD_MARGIN,
    }
    both = RewardConfig(r_bad=-0.5, overflow_reward=-9.0)
    assert both.settled(True, None) is both  # nothing to calibrate: no bundle needs a lowest logit


def test_a_bundle_without_its_lowest_logit_is_refused():
    with pytest.raises(
        PropelError, match=r"records no lowest valid logit.*set reward.r_bad and reward.overflow_reward"
    ):
        RewardConfig().settled(True, None, "the probe bundle old/")


def test_an_unsettled_rule_refuses_to_pay_an_invalid_task(propel_registry):
    """A rule built on settings whose r_bad was never settled says so, instead of paying None."""
    with pytest.raises(RewardError, match="r_bad is not settled"):
        propel_registry.reward_rule("hard", RewardConfig())(task(False), {})


@pytest.mark.parametrize("lowest", [math.nan, -math.inf])
def test_a_non_finite_lowest_logit_is_refused(lowest):
    with pytest.raises(PropelError, match="gives a valid task the logit"):
        RewardConfig().settled(True, lowest, "the probe bundle p/")


def test_each_rule_is_calibrated_on_the_bundles_it_pays_logits_of():
    from pathlib import Path

    from propel_core.training.generator_reward import logit_bundles

    main, auxiliary, member = Path("main"), Path("aux"), Path("member")
    assert logit_bundles(frozenset({"logit"}), [main, auxiliary, member]) == [main]  # hard: extra probes unread
    assert logit_bundles(frozenset({"logit", "auxiliary_logit"}), [main, auxiliary, member]) == [main, auxiliary]
    assert logit_bundles(frozenset({"ensemble_logits"}), [main, auxiliary, member]) == [main, auxiliary, member]
    assert logit_bundles(frozenset({"probability"}), [main, auxiliary]) == []


def bundle_at(folder, lowest):
    from propel_core.records import ProbeBundle

    folder.mkdir(parents=True)
    description = ProbeBundle(
        reference_model="m", layer=1, pooling="mean_full", architecture="linear", input_dim=2, max_length=8,
        training_rows=1, lowest_valid_logit=lowest,
    )  # fmt: skip
    (folder / "probe.json").write_text(description.model_dump_json())
    return folder


def test_settled_from_the_bundles_and_an_explicit_r_bad_above_them_is_warned(propel_registry, tmp_path, caplog):
    from types import SimpleNamespace

    from propel_core.training.generator_reward import settled_reward

    run = SimpleNamespace(registry=propel_registry)
    main, other = bundle_at(tmp_path / "main", -2.0), bundle_at(tmp_path / "other", -9.0)
    hard = settled_reward(run, RewardConfig(probes=[str(other)]), [main, other])
    assert (hard.r_bad, hard.overflow_reward) == (-2.0 - R_BAD_MARGIN,) * 2  # the unread bundle does not count
    wco = settled_reward(run, RewardConfig(rule="wco", probes=[str(other)]), [main, other])
    assert wco.r_bad == -9.0 - R_BAD_MARGIN
    assert settled_reward(run, RewardConfig(rule="soft"), [main]).r_bad == PAPER_R_BAD
    settled_reward(run, RewardConfig(r_bad=-0.2), [main], quiet=True)  # a check before training: the scorer warns
    assert not caplog.records
    explicit = settled_reward(run, RewardConfig(r_bad=-0.2), [main])
    assert (explicit.r_bad, explicit.overflow_reward) == (-0.2, -2.0 - R_BAD_MARGIN)
    assert "reward.r_bad -0.2 is above the lowest logit -2.0" in caplog.text
    with pytest.raises(PropelError, match=r"no probe bundle in .*missing: run `propel probe` first"):
        settled_reward(run, RewardConfig(), [tmp_path / "missing"])


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_an_explicit_reward_must_be_finite(value):
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        RewardConfig(r_bad=value)
    with pytest.raises(ValidationError):
        RewardConfig(overflow_reward=value)
