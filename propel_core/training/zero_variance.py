"""What a GRPO training does with a group whose completions all earned one reward (``zero_variance``
of ``train`` and ``solve_train``).

GRPO's advantage is a completion's reward against its group's, so such a group has advantage zero
everywhere: it adds no policy gradient, only its KL term and its tokens to the loss's normalizer, which
shrinks the step the other groups take. ``keep`` (TRL's behaviour) leaves it in; ``drop`` leaves its
completions out of the loss and the normalizer, as DAPO's dynamic sampling filters such groups (DAPO
then samples more prompts until the batch is full; here the step learns from the groups that are left,
so every step costs the same). A group is judged by its rewards as the reward function gave them, the
same judgement as the reward log's ``degenerate_groups``.
"""

from __future__ import annotations

from collections.abc import Callable

from propel_core.errors import PropelError


def dropping_flat_groups(trainer_class: type, flat_rows: Callable[[], list[bool]]) -> type:
    """A subclass of TRL's GRPOTrainer that leaves the completions of zero-variance groups out of the
    loss and its normalizer, as TRL's ``mask_truncated_completions`` leaves out cut-off ones.
    ``flat_rows()`` says, after the reward function has scored the batch, which of its completions
    (this process's, in order) belong to such a group."""

    class DroppingTrainer(trainer_class):
        def _generate_and_score_completions(self, inputs):
            import torch

            out = super()._generate_and_score_completions(inputs)
            mask, counted = out.get("completion_mask"), out.get("num_items_in_batch")
            flat = flat_rows()
            if not isinstance(mask, torch.Tensor) or not isinstance(counted, torch.Tensor) or len(flat) != len(mask):
                raise PropelError(
                    "zero_variance: drop needs TRL's GRPOTrainer._generate_and_score_completions to return one "
                    "completion_mask row per scored completion and num_items_in_batch (as trl 1.9-1.16 do); "
                    "set zero_variance: keep"
                )
            dropped = torch.tensor(flat, device=mask.device)
            loss_mask = mask if out.get("tool_mask") is None else mask * out["tool_mask"]
            tokens = (loss_mask * dropped.unsqueeze(1)).sum()
            out["completion_mask"] = mask * (~dropped).unsqueeze(1).to(mask.dtype)
            out["num_items_in_batch"] = counted - self.accelerator.gather(tokens).sum()
            share = self.accelerator.gather(dropped.float()).mean().item()
            self._metrics["train" if self.model.training else "eval"]["zero_variance/dropped"].append(share)
            return out

    return DroppingTrainer
