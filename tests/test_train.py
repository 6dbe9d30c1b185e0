"""The probe reward scorer and a real 2-step GRPO run with LoRA on the embedded model."""

import json
import shutil
import statistics

import pytest
import torch

from propel_core.config import ModelConfig, validate_config
from propel_core.plugins import Registry
from propel_core.probes import load_probe
from propel_core.reward import RewardScorer
from propel_core.run import Run
from propel_core.stages.extract import extract
from propel_core.stages.probe import probe
from propel_core.stages.train import train

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def probed_run(tmp_path_factory, planted_run):
    """A run folder with a selected probe, trained on countdown tasks with a planted label."""
    folder = planted_run(tmp_path_factory.mktemp("train-run"))
    registry = Registry.build()
    data = {"run_dir": str(folder), "domain": {"name": "countdown"},
            "probe": {"layers": [8], "poolings": ["mean_full"], "architectures": ["linear"]},
            "train": {"steps": 2, "group_size": 4, "per_device_batch": 4, "gradient_accumulation": 1,
                      "max_completion_length": 24, "checkpoint_every": 100}}  # fmt: skip
    run = Run(validate_config(data, registry), registry, quiet=True)
    extract(run)
    probe(run)
    return run


def scorer_for(run):
    return RewardScorer(run, [load_probe(run.dir / "probes" / "selected", run.registry)])


def test_rewards_follow_the_hard_rule(probed_run):
    scorer = scorer_for(probed_run)
    prompt = probed_run.domain().generator_prompt(probed_run.domain().contexts()[0])
    completions = [
        [{"role": "assistant", "content": " 24\nNumbers: 3, 8, 8"}],  # valid once the prefill is added
        [{"role": "assistant", "content": " 99\nNumbers: 1, 1, 1"}],  # unreachable: invalid
        [{"role": "assistant", "content": " 24\nNumbers: 3, 8, 8"}],
    ]  # cut off at the length limit
    ids = [[1] * 5, [1] * 5, [1] * 24]
    rewards = scorer([prompt] * 3, completions, context_id=["countdown-000"] * 3, completion_ids=ids)
    expected_logit = scorer.probes[0].score(["Target: 24\nNumbers: 3, 8, 8"])[0]["logit"]
    assert rewards[0] == pytest.approx(expected_logit, abs=1e-4)
    assert rewards[1] == -0.2 and rewards[2] == 0.0


def test_one_reward_per_completion_and_logged(probed_run, tmp_path):
    scorer = scorer_for(probed_run)
    scorer.log_path = tmp_path / "log.jsonl"
    prompt = probed_run.domain().generator_prompt(probed_run.domain().contexts()[1])
    completions = [
        [{"role": "assistant", "content": text}]
        for text in (" 10\nNumbers: 2, 3, 5", "nonsense", " 7\nNumbers: 1, 2, 4", "??")
    ]
    rewards = scorer([prompt] * 4, completions)
    (entry,) = [json.loads(line) for line in scorer.log_path.read_text().splitlines()]
    assert len(rewards) == 4 and entry["validity_rate"] == 0.5
    assert entry["degenerate_groups"] == 0.0 and entry["reward_mean"] == pytest.approx(statistics.fmean(rewards))


def test_two_grpo_steps_update_the_adapter_and_not_the_reference(probed_run):
    reference = probed_run.registry.backend(ModelConfig())
    before = {name: value.clone() for name, value in reference.model.state_dict().items()}
    shutil.rmtree(probed_run.dir / "train", ignore_errors=True)
    train(probed_run)
    folder = probed_run.dir / "train"
    from safetensors.torch import load_file

    adapter = load_file(folder / "adapter" / "adapter_model.safetensors")
    lora_b = [value for name, value in adapter.items() if "lora_B" in name]
    assert len(lora_b) == 30 * 7  # every layer's 7 projections
    assert any(value.abs().sum() > 0 for value in lora_b)  # PEFT starts B at zero: nonzero means it trained
    after = reference.model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)  # the frozen reference is untouched
    steps = [json.loads(line) for line in (folder / "reward_log.jsonl").read_text().splitlines()]
    assert len(steps) == 2 and all(0 <= s["validity_rate"] <= 1 for s in steps)
    assert any(s["reward_std"] > 0 for s in steps)


def test_solver_in_the_loop_runs_the_solver_and_needs_no_probe(probed_run):
    from propel_core.config import validate_config as validate

    data = probed_run.config.model_dump(mode="json") | {"reward": {"rule": "solver_in_the_loop"}}
    data["label"] = {"k": 2}
    data["solver"] = {"sampling": {"max_new_tokens": 16}}
    run = Run(validate(data, probed_run.registry), probed_run.registry, quiet=True)
    scorer = RewardScorer(run, probes=[])
    prompt = run.domain().generator_prompt(run.domain().contexts()[0])
    completions = [
        [{"role": "assistant", "content": " 24\nNumbers: 3, 8, 8"}],
        [{"role": "assistant", "content": "??"}],
    ]
    rewards = scorer([prompt] * 2, completions)
    assert rewards[0] in (0.0, 1.0) and rewards[1] == -0.2
    with pytest.raises(Exception, match="reads probe scores, but no probe bundle was given"):
        RewardScorer(probed_run, probes=[])
