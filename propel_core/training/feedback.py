"""What every reward function of a GRPO run gives back once it has scored a batch (:class:`FeedsBack`),
whether it rewards the generator's tasks or the solver's answers."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from propel_core.backend import prefill as prompt_prefill
from propel_core.contracts import ContextSampler
from propel_core.records import Context, JsonlWriter
from propel_core.training.replay import ReplayBuffer

if TYPE_CHECKING:
    pass


def completion_text(completion) -> str:
    return completion if isinstance(completion, str) else completion[-1]["content"]


def generations(prompts, completions, prefill) -> list[str]:
    """Each completion after the prefill its prompt ended with: the whole text the model wrote."""
    starts = prefill or [prompt_prefill(prompt) for prompt in prompts]
    return [start + completion_text(completion) for start, completion in zip(starts, completions, strict=True)]


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
            with JsonlWriter(self.log_path, fsync=False) as out:
                out.write(entry)
