"""A training's pace (propel_core.training.pace): torch's threads chosen at each step as the executor
chooses them, and the step's phases on the progress bar. Real GRPO steps showing their phases:
tests/test_train.py."""

import contextlib
from types import SimpleNamespace

import pytest
import torch

from propel_core.training.pace import Pace
from propel_plugins import executors


def recording(shown: list):
    """A ``services.progress`` that keeps the bar's description and total, then each advance."""

    @contextlib.contextmanager
    def progress(description, total):
        shown.append((description, total))
        yield lambda n=1, in_flight=None: shown.append((n, in_flight))

    return progress


@pytest.mark.parametrize("busy", [0, 1, 64])
def test_each_step_takes_the_threads_the_executor_would_choose(busy, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setattr(executors, "busy_threads", lambda: busy)
    before, pace = torch.get_num_threads(), Pace(SimpleNamespace(progress=recording([])))
    chosen = max(1, executors.available_cores() - busy)  # one job, the training: the cores others leave
    pace.begin(steps=2, done=0)
    try:
        pace.step_begins(1)
        assert pace.threads == torch.get_num_threads() == executors.chosen_threads(1) == chosen
        monkeypatch.setattr(executors, "busy_threads", lambda: 64)  # the machine got busy: the next step sees it
        pace.step_ends()
        pace.step_begins(2)
        assert torch.get_num_threads() == 1
    finally:
        pace.close()
    assert torch.get_num_threads() == before  # given back when training ends


def test_the_users_thread_setting_wins(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(executors, "busy_threads", lambda: 0)
    before, pace = torch.get_num_threads(), Pace(SimpleNamespace(progress=recording([])))
    torch.set_num_threads(3)
    try:
        pace.begin(steps=1, done=0)
        pace.step_begins(1)
        assert torch.get_num_threads() == 3 and pace.threads == 0
        assert "thread" not in pace.status()
        pace.close()
    finally:
        torch.set_num_threads(before)


def test_the_bar_names_the_phase_of_the_step_and_estimates_what_is_left(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    shown: list = []
    pace = Pace(SimpleNamespace(progress=recording(shown)))
    reward = pace.scoring(lambda prompts, completions, **_: [0.0] * len(prompts))
    assert reward.__name__ == "<lambda>"  # TRL names the reward's metrics after it
    pace.begin(steps=3, done=1)  # resumed after one step
    for step in (2, 3):
        pace.step_begins(step)
        assert reward(["p"], ["c"]) == [0.0]
        pace.step_ends()
    pace.close()
    assert shown[:2] == [("train", 3), (1, None)]
    statuses = [status for n, status in shown[2:]]
    assert statuses[:3] == ["step 2/3: generating 0 s", "step 2/3: scoring 0 s", "step 2/3: updating 0 s"]
    assert statuses[3].startswith("step 2/3 (0 s a step, about 0 s left)")
    assert statuses[4] == "step 3/3: generating 0 s (0 s a step, about 0 s left)"
    assert [n for n, _ in shown[2:]] == [0, 0, 0, 1, 0, 0, 0, 1]  # a step done advances the bar by one
