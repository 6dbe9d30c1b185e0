"""An example third-party reward rule with an option of its own, for the tests of how a rule is
configured (``reward.options.length_bonus``), enforced and shown.

A valid task earns ``per_letter`` for each letter of its word; an invalid one ``reward.r_bad``. The
rule reads no probe score, so it trains without a probe bundle.
"""

from propel_core import hookimpl


@hookimpl
def register_reward_rules(register):
    register("length_bonus", LengthBonus)


class LengthBonus:
    """per_letter for each letter of a valid task's word, r_bad for an invalid one.

    propel report shows this first paragraph as what the rule pays."""

    needs = frozenset()  # no probe scores: the reward comes from the task alone

    def __init__(self, config, per_letter: float = 0.1):
        self.r_bad, self.per_letter = config.r_bad, per_letter

    def __call__(self, task, scores):
        if not task.validity.valid:
            return self.r_bad
        return self.per_letter * len(task.payload["word"])
