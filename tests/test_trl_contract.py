"""Replay overrides TRL's private ``GRPOTrainer._generate``: these tests fail loudly when TRL changes it,
and show that a changed shape stops training with one line naming the TRL version and the change."""

import inspect
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from propel_core.errors import PropelError
from propel_core.training.replay import TRL_SUPPORTED, ReplayBuffer, prompt_key, replaying, trl_version

PROMPT = "Target: 24\nNumbers: 3, 8, 8\n"


def buffer_with(prompt, ids, text):
    buffer = ReplayBuffer("top_k", min_reward=0.0)
    buffer.add(prompt_key(prompt), (ids, text), 1.0, step=1)
    return buffer


def fake_trainer(generate):
    """A stand-in for GRPOTrainer whose ``_generate`` is ``generate``."""
    return type("FakeTrainer", (), {"_generate": generate})


def current(self, prompts):  # the shape of trl 1.9 to 1.16
    ids = [[7, 8] for _ in prompts]
    return [[1] for _ in prompts], ids, None, ["fresh"] * len(prompts), None, {}, None, []


def old(self, prompts):  # trl 1.0 to 1.8: total_completion_tokens where logprobs is now
    ids = [[7, 8] for _ in prompts]
    return [[1] for _ in prompts], ids, None, ["fresh"] * len(prompts), 4, None, {}, None, []


def test_the_pin_in_pyproject_is_the_supported_range_and_holds_the_installed_trl():
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    (trl,) = [Requirement(line) for line in project["dependencies"] if Requirement(line).name == "trl"]
    assert str(trl.specifier) == str(Requirement(f"trl{TRL_SUPPORTED}").specifier)
    assert Version(trl_version()) in trl.specifier, f"trl {trl_version()} is outside trl{TRL_SUPPORTED}"


def test_grpo_trainers_private_generate_still_takes_prompts():
    from trl import GRPOTrainer

    assert list(inspect.signature(GRPOTrainer._generate).parameters) == ["self", "prompts"]
    caller = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "= self._generate(prompts)" in caller  # TRL still calls it, so the override still runs
    assert issubclass(replaying(GRPOTrainer, ReplayBuffer("top_k", min_reward=0.0), 1), GRPOTrainer)


def test_the_last_slot_of_each_prompt_is_swapped_for_a_replayed_completion():
    buffer = buffer_with(PROMPT, [5, 6, 2], "replayed")
    trainer = replaying(fake_trainer(current), buffer, slots=1)()
    out = trainer._generate([PROMPT, PROMPT, "other prompt"])
    assert out[1] == [[7, 8], [5, 6, 2], [7, 8]] and out[3] == ["fresh", "replayed", "fresh"]
    assert len(out) == 8 and buffer.replayed == {(prompt_key(PROMPT), (5, 6, 2))}


@pytest.mark.parametrize(
    ("generate", "message"),
    [
        (None, "FakeTrainer has no method _generate"),
        (lambda self, prompts, images: current(self, prompts), r"has _generate\(prompts, images\) instead of"),
    ],
)
def test_a_changed_signature_fails_when_the_class_is_made(generate, message):
    trainer_class = fake_trainer(generate) if generate else type("FakeTrainer", (), {})
    with pytest.raises(PropelError, match=message) as error:
        replaying(trainer_class, ReplayBuffer("top_k", min_reward=0.0), 1)
    assert f"trl {trl_version()} " in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("generate", "message"),
    [
        (old, r"returns int as _generate's field 4 \(logprobs\), expected None or a list of 2"),
        (lambda self, prompts: {"completion_ids": []}, r"returns dict from _generate, not a tuple of \(prompt_ids"),
        (lambda self, prompts: current(self, prompts)[:4], "returns a tuple of 4 from _generate"),
        (lambda self, prompts: current(self, prompts[:1]), r"returns a list of 1 as _generate's field 0"),
        (lambda self, prompts: (None, *current(self, prompts)[1:]), r"field 0 \(prompt_ids\), expected a list"),
        (lambda self, prompts: ([[1]] * 2, ["ab", "cd"], None, ["x"] * 2, None), "not lists of int token ids"),
    ],
)
def test_a_changed_return_shape_fails_at_the_first_generation(generate, message):
    trainer = replaying(fake_trainer(generate), buffer_with(PROMPT, [5], "replayed"), slots=1)()
    with pytest.raises(PropelError, match=message) as error:
        trainer._generate([PROMPT, PROMPT])
    assert str(error.value).startswith(
        f"train.replay overrides TRL's private GRPOTrainer._generate as in trl{TRL_SUPPORTED}"
    )
    assert f"trl {trl_version()} " in str(error.value) and "\n" not in str(error.value)


def test_vllm_logprobs_or_tools_are_refused_clearly():
    def with_logprobs(self, prompts):
        out = list(current(self, prompts))
        out[4] = [[-0.5, -0.1] for _ in prompts]
        return tuple(out)

    trainer = replaying(fake_trainer(with_logprobs), buffer_with(PROMPT, [5], "replayed"), slots=1)()
    with pytest.raises(ValueError, match="replay works with plain generation"):
        trainer._generate([PROMPT, PROMPT])


@pytest.mark.slow
def test_a_real_grpo_generation_step_is_replayed(tmp_path):
    """TRL's own ``_generate`` on the embedded model: its return has the shape replay unpacks, and the
    swapped token ids and text are what the rest of the step (rewards included) receives."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from propel_core.embedded import resolve_model

    path = resolve_model(None)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    replayed_ids = tokenizer(" 8 * 3 = 24", add_special_tokens=False)["input_ids"]
    buffer = buffer_with(PROMPT, replayed_ids, " 8 * 3 = 24")

    def zero(completions, **_):
        return [0.0] * len(completions)

    arguments = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=4,
        use_cpu=True,
        report_to="none",
        seed=0,
    )
    trainer = replaying(GRPOTrainer, buffer, slots=1)(
        model=AutoModelForCausalLM.from_pretrained(path),
        reward_funcs=[zero],
        args=arguments,
        train_dataset=Dataset.from_list([{"prompt": PROMPT}] * 2),
        processing_class=tokenizer,
    )
    out = trainer._generate([PROMPT, PROMPT])
    prompt_ids, completion_ids, tool_mask, completions, logprobs = out[:5]
    assert tool_mask is None and logprobs is None and len(prompt_ids) == 2
    assert all(isinstance(t, int) for t in completion_ids[0]) and isinstance(completions[0], str)
    assert (completion_ids[1], completions[1]) == (replayed_ids, " 8 * 3 = 24")
    assert buffer.replayed == {(prompt_key(PROMPT), tuple(replayed_ids))}
