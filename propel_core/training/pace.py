"""How a training keeps pace with the machine it shares, and shows it: :class:`Pace` gives torch, at
every step, the threads the local executor would give one job then (the cores that other threads
leave free; ``chosen_threads``), and puts the step's phase on the run's progress bar
(``services.progress``): ``step 3/20: generating 41 s, 1 thread (52 s a step, about 15 min left)``,
then ``scoring`` (the reward), then ``updating`` (the loss's forward and backward passes, the
optimizer step). A GRPO step on a CPU takes seconds to minutes, and more threads than the machine's
other work leaves free make it many times slower: the bar says which phase runs and for how long.
The generator's training, solve-train and self-train keep pace this way."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from propel_core.ranks import is_main
from propel_core.services import Services

#: seconds between two refreshes of the step's phase on the bar (its seconds count up)
REFRESH = 1.0


class Pace:
    """Torch's threads and the progress bar (``description``) of a TRL training, each step starting in
    the ``first`` phase: ``scoring(reward)`` wraps the reward function, so its call shows as the
    step's ``scoring`` phase, and ``attached(trainer)`` is the block the trainer trains in, with this
    pace's callback in place of transformers' own bar."""

    def __init__(self, services: Services, description: str = "train", first: str = "generating"):
        self.services, self.description, self.first = services, description, first
        self.phase, self.step, self.steps = "", 0, 0
        self.since = self.started = 0.0
        self.durations: list[float] = []
        self.threads = 0  # torch's threads of the step running, as chosen (0: the user's, left alone)
        self.threads_before: int | None = None
        self._bar: contextlib.AbstractContextManager | None = None
        self._advance: Callable[..., None] | None = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    @contextlib.contextmanager
    def attached(self, trainer) -> Iterator[None]:
        """``trainer`` with this pace's callback and without transformers' progress bar (its lines of
        logged metrics stay, printed as they are with ``-q``); the bar closed and torch's threads put
        back when the block ends, whether training finished or failed."""
        from transformers import TrainerCallback
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        pace = self

        class Paced(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                pace.begin(state.max_steps, state.global_step)

            def on_step_begin(self, args, state, control, **kwargs):
                pace.step_begins(state.global_step + 1)

            def on_step_end(self, args, state, control, **kwargs):
                pace.step_ends()

            def on_train_end(self, args, state, control, **kwargs):
                pace.close()

        if trainer.pop_callback(ProgressCallback) is not None:
            trainer.add_callback(PrinterCallback)
        trainer.add_callback(Paced())
        try:
            yield
        finally:
            self.close()

    def scoring(self, reward: Callable) -> Callable:
        """``reward`` (TRL's reward function), its calls shown as the step's ``scoring`` phase and what
        follows them as ``updating``."""

        def scored(*args, **kwargs):
            self.enter("scoring")
            try:
                return reward(*args, **kwargs)
            finally:
                self.enter("updating")

        scored.__name__ = getattr(reward, "__name__", type(reward).__name__)  # TRL names its metrics after it
        return scored

    def begin(self, steps: int, done: int) -> None:
        """Training of ``steps`` starts, ``done`` of them before (resumed from a checkpoint)."""
        import torch

        self.threads_before, self.steps = torch.get_num_threads(), steps
        if not is_main():  # the main process of a launch shows the bar
            return
        self._bar = self.services.progress(self.description, steps)
        self._advance = self._bar.__enter__()
        if done:
            self._advance(done)
        self._ticker = threading.Thread(target=self._tick, name="propel-pace", daemon=True)
        self._ticker.start()

    def step_begins(self, step: int) -> None:
        """Step ``step`` (from 1) starts: torch's threads chosen for it, and its first phase (generating,
        or for a training that samples nothing, such as SFT, updating)."""
        import torch

        from propel_plugins.executors import chosen_threads

        self.threads = chosen_threads(1) or 0  # one job: this training; None where the user set them
        if self.threads:
            torch.set_num_threads(self.threads)
        self.step, self.started = step, time.monotonic()
        self.enter(self.first)

    def step_ends(self) -> None:
        self.durations.append(time.monotonic() - self.started)
        self.phase = ""
        self._show(advance=1)

    def enter(self, phase: str) -> None:
        self.phase, self.since = phase, time.monotonic()
        self._show()

    def status(self) -> str:
        """``step 3/20: generating 41 s, 1 thread (52 s a step, about 15 min left)``; the step's phase
        and seconds in it, torch's threads where they were chosen, and once a step is done, the mean
        step and the time left at that pace."""
        now = time.monotonic()
        text = f"step {self.step}/{self.steps}"
        if self.phase:
            text += f": {self.phase} {now - self.since:.0f} s"
        if self.threads:
            text += f", {self.threads} thread{'s' if self.threads > 1 else ''}"
        if self.durations:
            mean = sum(self.durations) / len(self.durations)
            running = now - self.started if self.phase else 0.0
            left = max(0.0, mean * (self.steps - self.step + (1 if self.phase else 0)) - running)
            text += f" ({mean:.0f} s a step, about {_duration(left)} left)"
        return text

    def close(self) -> None:
        """Stop the bar's refreshes, close it, and give torch back its threads (once)."""
        import torch

        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = self._advance = None
        if self.threads_before is not None:
            torch.set_num_threads(self.threads_before)
            self.threads_before = None

    def _show(self, advance: int = 0) -> None:
        if self._advance is not None:
            self._advance(advance, self.status())

    def _tick(self) -> None:
        while not self._stop.wait(REFRESH):
            if self.phase:
                self._show()


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
