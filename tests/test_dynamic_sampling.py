"""``zero_variance: drop`` and ``refill`` (DAPO's dynamic sampling) on TRL's own GRPOTrainer and
RLOOTrainer with the embedded model: which groups leave the loss, which further prompts refill the
batch, that the merged batch's rows are the completions the reward function scored, and what the
reward log records of each step."""

import json

import pytest
import torch

from propel_core.errors import PropelError
from propel_core.training.feedback import FeedsBack, Stall
from propel_core.training.zero_variance import zero_variance_trainer

pytestmark = pytest.mark.slow

SIZE = 8
LONG = "Half won, in a prompt some tokens longer than the others."
#: prompt -> the rewards of its group, in order: seven winners and a loser; one reward for all; a spread
REWARDS = {
    "Seven won.": [1.0] * 7 + [0.0],
    "All won.": [1.0] * SIZE,
    "Half won.": [1.0, 0.0] * (SIZE // 2),
    LONG: [1.0, 0.0] * (SIZE // 2),
}


class GroupRewards(FeedsBack):
    """A reward function that pays each group of a prompt its ``REWARDS``, feeding back as propel's do,
    and remembers the completions it scored per prompt."""

    __name__ = "group_rewards"

    def __init__(self, log_path):
        self.sampler, self.contexts, self.replay, self.log_path = None, {}, None, log_path
        self.calls, self.stall, self.scored = 0, Stall("solve_train", SIZE, None), []

    def __call__(self, prompts, completions, completion_ids, trainer_state=None, **_):
        step = self.step(trainer_state)
        rewards = [REWARDS[prompt][i % SIZE] for i, prompt in enumerate(prompts)]
        self.scored.append(list(zip(prompts, completion_ids, strict=True)))
        whole, own = self.whole_step(rewards, 0, cut=[], contexts=[])
        self.write_log({"step": step, "reward_mean": sum(rewards) / len(rewards)}, whole, own)
        return rewards


class TornRewards(GroupRewards):
    """Says which completions were flat for fewer rows than TRL scored: TRL changed what it returns."""

    def write_log(self, entry, whole, own):
        super().write_log(entry, whole, own)
        self.flat = self.flat[:1]


def trainer(tmp_path, kind, mode, further, max_refills=2, rewards=GroupRewards):
    """TRL's ``kind`` trainer (grpo or rloo) on the embedded model under ``zero_variance: mode``, its
    training set ``further`` (the prompts a refill draws, in order), and its reward function (``rewards``)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

    from propel_core.embedded import resolve_model

    path = resolve_model(None)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    config_class, trainer_class = (GRPOConfig, GRPOTrainer) if kind == "grpo" else (RLOOConfig, RLOOTrainer)
    own = {"loss_type": "dapo"} if kind == "grpo" else {}
    arguments = config_class(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2 * SIZE,
        num_generations=SIZE,
        max_completion_length=4,
        use_cpu=True,
        report_to="none",
        seed=0,
        beta=0.0,
        **own,
    )
    reward = rewards(tmp_path / "reward_log.jsonl")
    built = zero_variance_trainer(trainer_class, reward, mode, max_refills=max_refills, section="solve_train")(
        model=AutoModelForCausalLM.from_pretrained(path),
        reward_funcs=[reward],
        args=arguments,
        train_dataset=Dataset.from_list([{"prompt": prompt} for prompt in further]),
        processing_class=tokenizer,
    )
    built.model.train()  # as in a training step: the metrics go to the train ones
    return built, reward


def batch(*prompts):
    return [{"prompt": prompt} for prompt in prompts for _ in range(SIZE)]


def logged(tmp_path):
    return [json.loads(line) for line in (tmp_path / "reward_log.jsonl").read_text().splitlines()]


def test_grpo_drop_leaves_the_flat_group_out_of_the_loss_mask_and_the_token_count(tmp_path):
    """drop on a GRPO step (dapo loss): the completions of the group of one reward leave the loss mask
    and the token count the loss divides by, the other group's stay, and the share dropped is logged;
    a scored batch whose rows do not match the reward function's stops with one line."""
    built, _ = trainer(tmp_path, "grpo", "drop", further=[])
    out = built._generate_and_score_completions(batch("All won.", "Seven won."))
    kept = out["completion_mask"].sum(dim=1).tolist()
    assert kept[:SIZE] == [0] * SIZE and all(count > 0 for count in kept[SIZE:])
    assert out["num_items_in_batch"].item() == sum(kept)
    assert built._metrics["train"]["zero_variance/dropped"] == [0.5]
    torn, _ = trainer(tmp_path / "torn", "grpo", "drop", further=[], rewards=TornRewards)
    with pytest.raises(PropelError, match="one completion_mask row per scored completion"):
        torn._generate_and_score_completions(batch("All won.", "Seven won."))


def test_rloo_keeps_the_spread_of_seven_winners_and_a_loser_and_drops_the_group_of_one_reward(tmp_path):
    """Under RLOO the group of seven winners and a loser is not flat: it keeps its leave-one-out
    advantages (1 - 6/7 for a winner, 0 - 1 for the loser), scaled by completions / kept completions
    (2), so the mean over the batch is the mean over the kept group; the group of one reward has
    advantage zero and counts for nothing."""
    built, _ = trainer(tmp_path, "rloo", "drop", further=[])
    out = built._generate_and_score_completions(batch("Seven won.", "All won."))
    expected = [2 * (1 - 6 / 7)] * 7 + [2 * -1.0] + [0.0] * SIZE
    assert out["advantages"].tolist() == pytest.approx(expected, abs=1e-5)
    assert built._metrics["train"]["zero_variance/dropped"] == [0.5]
    (entry,) = logged(tmp_path)
    assert entry["degenerate_groups"] == 0.5 and entry["zero_variance"] == {
        "flat": 1,
        "refilled": 0,
        "dropped": 1,
        "draws": [],
    }


def test_rloo_refills_the_group_of_one_reward_with_a_further_prompt(tmp_path):
    """refill draws the training set's next prompts until a group with a spread replaces the flat one
    (the first further prompt is flat too, so two draws): every advantage is the group's own
    leave-one-out, unscaled, and the merged rows are the completions scored for the refilling prompt."""
    built, reward = trainer(tmp_path, "rloo", "refill", further=["All won.", "Half won."])
    out = built._generate_and_score_completions(batch("Seven won.", "All won."))
    half = [1 - 3 / 7, -4 / 7] * (SIZE // 2)
    assert out["advantages"].tolist() == pytest.approx([1 - 6 / 7] * 7 + [-1.0] + half, abs=1e-5)
    assert [{prompt for prompt, _ in call} for call in reward.scored] == [
        {"Seven won.", "All won."},
        {"All won."},
        {"Half won."},
    ]
    refilled = [ids for _, ids in reward.scored[2]]
    for row, ids in zip(out["completion_ids"][SIZE:], refilled, strict=True):
        assert row[: len(ids)].tolist() == ids
    (entry,) = logged(tmp_path)
    assert entry["zero_variance"]["refilled"] == 1 and entry["zero_variance"]["dropped"] == 0
    assert [draw["degenerate_groups"] for draw in entry["zero_variance"]["draws"]] == [1.0, 0.0]
    metrics = built._metrics["train"]
    assert (metrics["zero_variance/refilled"], metrics["zero_variance/draws"]) == ([1], [2])


def test_grpo_refill_stops_at_max_refills_and_drops_what_is_still_flat(tmp_path):
    """GRPO (dapo loss) with max_refills 1: the one further draw is flat too, so the step learns from
    the group that has a spread: the flat group's completions leave the loss mask and the token count
    the loss divides by, and the reward log says one group dropped, none refilled, one draw made."""
    built, reward = trainer(tmp_path, "grpo", "refill", further=["All won.", "Half won."], max_refills=1)
    out = built._generate_and_score_completions(batch("All won.", "Seven won."))
    kept = out["completion_mask"].sum(dim=1).tolist()
    assert kept[:SIZE] == [0] * SIZE and all(count > 0 for count in kept[SIZE:])
    assert out["num_items_in_batch"].item() == sum(kept)
    assert len(reward.scored) == 2 and out["completion_ids"].shape[0] == 2 * SIZE
    (entry,) = logged(tmp_path)
    assert entry["zero_variance"] == {
        "flat": 1,
        "refilled": 0,
        "dropped": 1,
        "draws": [{"reward_mean": 1.0, "degenerate_groups": 1.0}],
    }
    assert built._metrics["train"]["zero_variance/dropped"] == [0.5]


def test_grpo_refill_merges_batches_of_different_widths_and_counts_only_kept_tokens(tmp_path):
    """The refilled batch is the first draw's kept group and the further draw's group, padded as TRL
    pads them (prompts on the left, completions on the right), with every per-token field aligned to
    its row; the loss's token count is the kept completions' tokens."""
    built, reward = trainer(tmp_path, "grpo", "refill", further=[LONG])
    out = built._generate_and_score_completions(batch("Seven won.", "All won."))
    assert out["prompt_ids"].shape[0] == out["completion_ids"].shape[0] == 2 * SIZE
    short, long = out["prompt_mask"][0], out["prompt_mask"][-1]
    assert short.sum() < long.sum() and short[-1] == 1 and short[0] == 0  # left-padded to the longer prompt
    assert out["num_items_in_batch"].item() == out["completion_mask"].sum().item() > 0
    for row, (_, ids) in zip(out["completion_ids"][SIZE:], reward.scored[1], strict=True):
        assert row[: len(ids)].tolist() == ids
    assert torch.all(out["advantages"][:SIZE] != 0) and logged(tmp_path)[0]["zero_variance"]["refilled"] == 1


def test_a_mode_that_is_not_one_is_refused(tmp_path):
    from trl import GRPOTrainer

    with pytest.raises(PropelError, match=r"solve_train.zero_variance: 'fill' is not one of keep, drop, refill"):
        zero_variance_trainer(GRPOTrainer, GroupRewards(None), "fill", max_refills=1, section="solve_train")
