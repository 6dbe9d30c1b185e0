"""What every reward function of a GRPO run gives back once it has scored a batch (:class:`FeedsBack`),
whether it rewards the generator's tasks or the solver's answers."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from propel_core.backend import before_stop
from propel_core.backend import prefill as prompt_prefill
from propel_core.contracts import ContextSampler
from propel_core.ranks import gathered, is_main, process_index
from propel_core.records import Context, JsonlWriter
from propel_core.training.replay import ReplayBuffer

log = logging.getLogger("propel")

#: a step's batch shows GRPO learning nothing when at least this share of its completions hit the
#: length limit, or of its groups gave all their completions one reward; so many steps in a row, and
#: the training says so
STALL_SHARE, STALL_STEPS = 0.5, 3


def completion_text(completion) -> str:
    return completion if isinstance(completion, str) else completion[-1]["content"]


def generations(prompts, completions, prefill, stop: list[str] = ()) -> list[str]:
    """Each completion after the prefill its prompt ended with, up to its first ``stop`` string (TRL's
    generation keeps the stop string, which the backends leave out): the whole text the model wrote."""
    starts = prefill or [prompt_prefill(prompt) for prompt in prompts]
    return [
        start + before_stop(completion_text(completion), stop)
        for start, completion in zip(starts, completions, strict=True)
    ]


class Stall:
    """Watches each step's batch for the two ways GRPO learns nothing, and raises the alarm when one
    lasts ``STALL_STEPS`` steps in a row: most completions cut off at the length limit (the generator's
    then earn the overflow reward, whatever they say), or most groups whose completions all earned one reward (the
    advantage is zero there, so no gradient). ``section`` names the config section whose settings
    the alarm points to (``train``, ``solve_train``); ``group_size`` and ``limit`` (tokens) are that
    training's, and a sign whose number is None is not watched. ``stop`` (the stop strings the
    generation stopped at) and ``ends`` (its end-of-sequence tokens) tell a completion the model ended
    at the limit from one the limit cut."""

    def __init__(self, section: str, group_size: int | None, limit: int | None, stop: list[str] = ()):
        self.section, self.group_size, self.limit, self.stop = section, group_size, limit, list(stop)
        self.ends: set[int] = set()
        self.streaks: dict[str, list[tuple[int, float]]] = {"cut_off": [], "degenerate_groups": []}

    def cut_off(self, completion_ids, completions) -> list[bool]:
        """Which completions the length limit cut off: as long as the limit, and ended by neither an
        end token nor a stop string (none known without their token ids)."""
        if self.limit is None or not completion_ids:
            return []
        return [
            ids is not None
            and len(ids) >= self.limit
            and ids[-1] not in self.ends
            and before_stop(completion_text(completion), self.stop) == completion_text(completion)
            for ids, completion in zip(completion_ids, completions, strict=True)
        ]

    def flat_rows(self, rewards: list[float]) -> list[bool]:
        """Which completions belong to a group (``group_size`` in a row) whose completions all earned one
        reward; none where no group size is known."""
        size = self.group_size or 1
        groups = [rewards[i : i + size] for i in range(0, len(rewards), size)]
        return [bool(self.group_size) and len(set(group)) == 1 for group in groups for _ in group]

    def signs(self, rewards: list[float], cut: list[bool]) -> dict[str, float]:
        """The batch's share of completions ``cut`` off at the limit, and of groups of one reward."""
        out = {}
        if cut:
            out["cut_off"] = sum(cut) / len(cut)
        if self.group_size:
            firsts = self.flat_rows(rewards)[:: self.group_size]
            out["degenerate_groups"] = sum(firsts) / len(firsts)
        return out

    def resume(self, entries: list[dict]) -> None:
        """Take up the streaks of a resumed training from its reward log's ``entries`` (cut back to the
        steps before its checkpoint): a streak already said is not said again, and one that spans the
        resume goes on."""
        for entry in entries:
            self.alarm(entry["step"], entry)

    def alarm(self, step: int, signs: dict[str, float]) -> str | None:
        """The line to say when a sign has just lasted ``STALL_STEPS`` steps (the cut-off first: it
        makes groups of one reward too), else None; once a streak, again if it ends and comes back."""
        for sign, streak in self.streaks.items():
            if signs.get(sign, 0.0) >= STALL_SHARE:
                streak.append((step, signs[sign]))
            else:
                streak.clear()
        for sign, streak in self.streaks.items():
            if len(streak) != STALL_STEPS:
                continue
            steps, least = f"steps {streak[0][0] + 1}-{streak[-1][0] + 1}", min(share for _, share in streak)
            if sign == "cut_off":
                return (
                    f"{self.section}: in {steps} {least:.0%} or more of the completions hit the length limit "
                    f"({self.limit} tokens) and were cut off before they finished, so GRPO has little to learn "
                    f"from; raise {self.section}.max_completion_length"
                )
            return (
                f"{self.section}: in {steps} {least:.0%} or more of the groups gave all {self.group_size} of their "
                f"completions one reward, where GRPO's advantage is zero and nothing is learned; raise "
                f"{self.section}.group_size or the sampling temperature, or look at what the rule pays "
                "(reward_log.jsonl)"
            )
        return None


def logged_steps(log_path: Path) -> list[dict]:
    """The entries of a training's reward log, one a step (none where there is no log yet)."""
    lines = log_path.read_text().splitlines() if log_path.exists() else []
    return [json.loads(line) for line in lines if line.strip()]


def reward_never_moved(entries: list[dict]) -> str | None:
    """A sentence for the end of a training whose every step gave every completion the same reward
    (``entries``: its reward log's), else None."""
    means = {entry["reward_mean"] for entry in entries}
    if not entries or len(means) > 1 or any(entry["reward_std"] > 0 for entry in entries):
        return None
    return (
        f"the reward never moved: every completion of all {len(entries)} steps earned {means.pop():.3g}, so "
        "GRPO learned nothing (the alarms above, and reward_log.jsonl, say why)"
    )


class FeedsBack:
    """What every reward function of a GRPO run gives back once it has scored a batch, whatever it
    scores with: the fresh generations to the replay buffer (``replay``), the whole step's rewards
    (every process's of a launch) to the context sampler (``sampler``, by ``contexts``), and what both
    did to the step's log entry (``log_path``). ``calls`` numbers the calls where TRL gives no trainer
    state."""

    sampler: ContextSampler | None
    contexts: dict[str, Context]
    replay: ReplayBuffer | None
    log_path: Path | None
    calls: int
    stall: Stall
    flat: tuple[bool, ...] = ()
    #: ``zero_variance: drop`` or ``refill`` (``hold``): the entries of the step's draws of prompts so
    #: far, which wait until the trainer has settled the step's batch (``close_step``)
    held: list[dict[str, Any]] | None = None

    def step(self, trainer_state) -> int:
        """The optimizer step this call scores for (and count the call)."""
        self.calls += 1
        return trainer_state.global_step if trainer_state is not None else self.calls - 1

    def offer_replays(self, step: int, prompts, completions, completion_ids, rewards: list[float]) -> int:
        """Give this process's fresh generations to its replay buffer; the number of replays in its batch."""
        if self.replay is None or completion_ids is None:
            return 0
        return self.replay.offer(step, prompts, completions, completion_ids, rewards)

    def whole_step(self, rewards: list[float], replayed: int, **columns: list) -> tuple[dict[str, list], slice]:
        """This call's ``rewards`` and ``columns`` (a value a completion) joined with every other process's
        of a launch, in rank order (the order TRL gathers the batch in, so its groups are whole), with
        each process's ``replayed`` and replay admissions; and the slice of them that is this process's."""
        admitted = self.replay.admitted if self.replay is not None else 0
        parts = gathered({"rewards": rewards, "replayed": [replayed], "admitted": [admitted], **columns})
        before = sum(len(part["rewards"]) for part in parts[: process_index()])
        whole = {name: [value for part in parts for value in part[name]] for name in parts[0]}
        return whole, slice(before, before + len(rewards))

    def write_log(self, entry: dict[str, Any], whole: dict[str, list], own: slice) -> None:
        """Feed the step's rewards back to the sampler by their ``contexts``, add the step's stall signs
        (``cut``: which completions the length limit cut off; and the alarm, said in one line, when one
        has lasted), the replay buffer's and the sampler's numbers to ``entry`` and append it to the
        log. ``whole`` is the step of every process (``whole_step``), so each process's sampler and
        alarms see the same, and the main process writes the one entry. ``flat`` keeps which of this
        process's completions (``own``) were in a group of one reward, for ``zero_variance``. While
        :meth:`hold` says so (``zero_variance: drop`` or ``refill``), the entry waits for :meth:`close_step`."""
        rewards = whole["rewards"]
        if self.sampler is not None and whole.get("contexts"):
            self.sampler.update([self.contexts[c] for c in whole["contexts"]], rewards)
        self.flat = tuple(self.stall.flat_rows(rewards)[own])
        entry |= self.stall.signs(rewards, whole["cut"])
        if self.replay is not None:
            entry |= {"replayed": sum(whole["replayed"]), "replay_admitted": sum(whole["admitted"])}
        if self.held is not None:
            self.held.append(entry)
        else:
            self.record(entry)

    def hold(self) -> None:
        """From now on, each step's log entry waits for :meth:`close_step`."""
        self.held = []

    def close_step(self, counts: dict[str, int]) -> None:
        """Write the held entry of the step's batch with ``counts`` (what ``zero_variance`` did to its
        groups) under ``zero_variance``, and the reward mean and share of groups of one reward of each
        further draw of prompts that refilled it."""
        first, *draws = self.held
        self.held = []
        first["zero_variance"] = counts | {
            "draws": [{key: draw.get(key) for key in ("reward_mean", "degenerate_groups")} for draw in draws]
        }
        self.record(first)

    @property
    def draw(self) -> int:
        """Which draw of prompts of its step the call being scored is: 0 for the step's batch, then 1,
        2, ... for the further draws that refill its groups of one reward (``zero_variance: refill``)."""
        return len(self.held or ())

    def record(self, entry: dict[str, Any]) -> None:
        """The step's alarm and the sampler's numbers into ``entry``, and the entry into the log."""
        alarm = self.stall.alarm(entry["step"], entry)
        if alarm is not None:
            if is_main():
                log.warning("%s", alarm)
            entry["alarm"] = alarm
        if self.sampler is not None and hasattr(self.sampler, "diagnostics"):
            entry["sampler"] = self.sampler.diagnostics()
        if self.log_path is not None and is_main():
            with JsonlWriter(self.log_path, fsync=False) as out:
                out.write(entry)
