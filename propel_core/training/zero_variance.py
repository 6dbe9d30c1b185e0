"""What a GRPO or RLOO training does with a group whose completions all earned one reward
(``zero_variance`` of ``train`` and ``solve_train``).

The advantage is a completion's reward against its group's, so such a group has advantage zero
everywhere: it adds no policy gradient, only its KL term and its tokens to the loss's normalizer (GRPO)
or its place in the mean over completions (RLOO), which shrinks the step the other groups take.

- ``keep`` (TRL's behaviour) leaves it in.
- ``drop`` leaves it out of the loss and its normalizer: under GRPO its completions leave the loss
  mask and the token count the token-level loss divides by; under RLOO (whose loss is a mean over
  completions, and whose KL term is in the reward) its advantages are zeroed and the kept ones scaled by
  completions / kept completions, which is the mean over the kept completions exactly (the clipped
  objective is proportional to the advantage). The step learns from the groups that are left.
- ``refill`` is DAPO's dynamic sampling: the flat groups are dropped and the batch is refilled with the
  groups of further prompts, drawn from the training set (the run's context sampler, seeded) and scored
  as the step's own were; a further draw holds as many prompts as the step still misses groups, and at
  most ``max_refills`` draws are made, after which the step learns from what it has (the flat groups
  still in it are dropped as ``drop`` drops them). Every group's advantage is its own (GRPO's
  ``scale_rewards: group``, RLOO's leave-one-out), so groups of different draws mix exactly.

A group is judged by its rewards as the reward function gave them, the same judgement as the reward
log's ``degenerate_groups``: seven winners and one loser is a group with a spread, kept. The reward
log's entry of each step (the step's batch as first drawn) gets ``zero_variance``: its groups of one
reward (``flat``), those refilled from further draws (``refilled``) and those dropped (``dropped``),
with each further draw's reward mean and share of groups of one reward (``draws``); TRL's log gets
``zero_variance/dropped`` (the share of the step's completions left out) and, refilling,
``zero_variance/refilled`` and ``zero_variance/draws``.
"""

from __future__ import annotations

from typing import Any

from propel_core.errors import PropelError
from propel_core.ranks import gathered, is_main, process_count, process_index
from propel_core.training.feedback import FeedsBack

#: what a training does with its groups of one reward (docs/config.md)
MODES = ("keep", "drop", "refill")
#: the fields of TRL's scored batch (GRPOTrainer's and RLOOTrainer's ``_generate_and_score_completions``,
#: trl 1.9-1.16) that refill merges row by row: left-padded on the prompt's side, right-padded on the
#: completion's (with the value TRL pads them with), one value a completion
PROMPT_SIDE = {"prompt_ids": "pad", "prompt_mask": 0}
COMPLETION_SIDE = {
    "completion_ids": "pad",
    "completion_mask": 0,
    "tool_mask": 1,
    "old_per_token_logps": 0.0,
    "ref_per_token_logps": 0.0,
    "sampling_per_token_logps": 0.0,
    "importance_sampling_ratio": 0.0,
}
PER_COMPLETION = ("advantages", "old_logps")


def zero_variance_trainer(
    trainer_class: type, feedback: FeedsBack, mode: str, *, max_refills: int, section: str
) -> type:
    """``trainer_class`` (TRL's GRPOTrainer or RLOOTrainer, or a subclass) as ``mode`` says: itself for
    ``keep``, else a subclass that drops (and with ``refill`` replaces) the groups of one reward of each
    step's batch. ``feedback`` is the reward function (its ``flat`` says which of the completions it
    last scored were in such a group; it holds each step's log entry until the step is settled);
    ``section`` names the config section the refusals point to."""
    from trl import RLOOTrainer

    if mode not in MODES:
        raise PropelError(f"{section}.zero_variance: {mode!r} is not one of {', '.join(MODES)}")
    if mode == "keep":
        return trainer_class
    feedback.hold()
    rloo = issubclass(trainer_class, RLOOTrainer)
    refills = max_refills if mode == "refill" else 0

    class ZeroVarianceTrainer(trainer_class):
        def _generate_and_score_completions(self, inputs):
            size, training = self.num_generations, self.model.training  # an evaluation draws no further prompts
            if refills and len(inputs) % size:
                raise PropelError(
                    f"{section}.zero_variance: refill needs whole groups on every process: this process's "
                    f"generation batch holds {len(inputs)} completions, not a multiple of group_size ({size}); "
                    f"make {section}.per_device_batch a multiple of group_size, or set zero_variance: drop"
                )
            draws = [self._scored(inputs)]
            while training and len(draws) <= refills and (missing := self._missing(draws, size)):
                draws.append(self._scored(self._further(missing, size)))
            out, kept, counts = _settled(draws, size, self._tokenizer.pad_token_id)
            self._leave_out(out, kept)
            totals = self.accelerator.gather(self._tensor([len(kept), sum(kept), *counts])).view(-1, 5).sum(0)
            rows, kept_rows, flat, refilled, dropped = (int(n) for n in totals.tolist())
            metrics = self._metrics["train" if training else "eval"]
            metrics["zero_variance/dropped"].append(1 - kept_rows / rows)
            if refills:
                metrics["zero_variance/refilled"].append(refilled // size)
                metrics["zero_variance/draws"].append(len(draws) - 1)
            feedback.close_step({"flat": flat // size, "refilled": refilled // size, "dropped": dropped // size})
            return out

        def _scored(self, inputs) -> tuple[dict[str, Any], list[bool]]:
            """TRL's scored batch of ``inputs``, and which of its completions were in a group of one reward."""
            import torch

            out = super()._generate_and_score_completions(inputs)
            flat = list(feedback.flat)
            mask = out.get("completion_mask")
            counted = out.get("advantages" if rloo else "num_items_in_batch")
            if not isinstance(mask, torch.Tensor) or not isinstance(counted, torch.Tensor) or len(flat) != len(mask):
                needs = "advantages" if rloo else "num_items_in_batch"
                raise PropelError(
                    f"zero_variance: {mode} needs TRL's {trainer_class.__name__}._generate_and_score_completions "
                    f"to return one completion_mask row per scored completion and {needs} (as trl 1.9-1.16 "
                    "do); set zero_variance: keep"
                )
            return out, flat

        def _missing(self, draws, size: int) -> int:
            """How many groups the process that misses most still misses: the step's flat groups not yet
            replaced by a group with a spread from a further draw."""
            _, flat = draws[0]
            spread = sum(not row for _, more in draws[1:] for row in more[::size])
            own = max(0, sum(flat[::size]) - spread)
            return int(self.accelerator.gather(self._tensor([own])).max())

        def _further(self, groups: int, size: int) -> list[dict]:
            """``groups`` further prompts of the training set for this process, each ``size`` times as
            TRL repeats them: the main process draws every process's from the training dataset (the
            run's context sampler, which only it samples for the trainer's batches), in rank order."""
            if not hasattr(self, "_further_prompts"):
                self._further_prompts = iter(self.train_dataset)
            drawn = [next(self._further_prompts) for _ in range(groups * process_count())] if is_main() else None
            own = gathered(drawn)[0][process_index() * groups : (process_index() + 1) * groups]
            return [dict(row) for row in own for _ in range(size)]

        def _leave_out(self, out: dict[str, Any], kept: list[bool]) -> None:
            """Leave the completions not ``kept`` out of ``out``'s loss, and its normalizer."""
            import torch

            keep = torch.tensor(kept, device=out["completion_mask"].device)
            if rloo:  # a mean over completions: zero the dropped ones' advantages, scale the kept ones'
                counts = self.accelerator.gather(self._tensor([len(kept), sum(kept)])).view(-1, 2).sum(0)
                scale = counts[0] / counts[1] if counts[1] else torch.tensor(1.0)
                out["advantages"] = out["advantages"] * keep.to(out["advantages"].dtype) * scale.item()
                return
            out["completion_mask"] = out["completion_mask"] * keep.unsqueeze(1).to(out["completion_mask"].dtype)
            loss_mask = (
                out["completion_mask"] if out.get("tool_mask") is None else out["completion_mask"] * out["tool_mask"]
            )
            out["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()

        def _tensor(self, values: list[int]):
            import torch

            return torch.tensor(values, device=self.accelerator.device)

    return ZeroVarianceTrainer


def _settled(draws: list[tuple[dict, list[bool]]], size: int, pad_id: int) -> tuple[dict, list[bool], list[int]]:
    """The step's batch: the first draw's groups, each group of one reward replaced by the next group
    with a spread of the further draws while there is one; which of its completions are kept (not in a
    group of one reward); and this process's completions in flat groups of the first draw, refilled and
    dropped."""
    (first, flat), further = draws[0], draws[1:]
    if not further:  # (groups may straddle the processes of a launch here)
        return first, [not row for row in flat], [sum(flat), 0, sum(flat)]
    spares = iter(
        [(d, at) for d, (_, more) in enumerate(further, 1) for at in range(0, len(more), size) if not more[at]]
    )
    rows, kept, refilled = [], [], 0
    for start in range(0, len(flat), size):
        spare = next(spares, None) if flat[start] else None
        draw, at = spare or (0, start)
        refilled += size if spare else 0
        rows += [(draw, at + i) for i in range(size)]
        kept += [not flat[start] or bool(spare)] * size
    return _merged([out for out, _ in draws], rows, pad_id), kept, [sum(flat), refilled, kept.count(False)]


def _merged(outs: list[dict], rows: list[tuple[int, int]], pad_id: int) -> dict:
    """One scored batch of the ``rows`` (draw, row) of several (``outs``), each tensor padded as TRL pads it."""
    import torch
    import torch.nn.functional as functional

    merged = {}
    for key, value in outs[0].items():
        if key == "num_items_in_batch" or value is None:
            merged[key] = value  # the count is redone once the batch is settled
            continue
        if key not in PROMPT_SIDE and key not in COMPLETION_SIDE and key not in PER_COMPLETION:
            raise PropelError(
                f"zero_variance: refill merges the text fields of TRL's scored batch, and this one has {key!r} "
                "(images, or another field it cannot merge); set zero_variance: drop"
            )
        side = "left" if key in PROMPT_SIDE else "right"
        pad = (PROMPT_SIDE | COMPLETION_SIDE).get(key, 0)
        pad = pad_id if pad == "pad" else pad
        width = max(out[key].shape[1] for out in outs) if value.dim() > 1 else 0
        parts = []
        for draw, row in rows:
            part = outs[draw][key][row]
            if width and part.shape[0] < width:
                room = (width - part.shape[0], 0) if side == "left" else (0, width - part.shape[0])
                part = functional.pad(part, room, value=pad)
            parts.append(part)
        merged[key] = torch.stack(parts)
    return merged
