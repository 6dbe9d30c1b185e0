"""Generator RL in the SWE domain: multi-turn rollouts of the embedded model acting in the sandbox
on the tiny repository, rewards from the verifier and a probe reading the finished trajectory, and
real GRPO steps (DAPO loss, soft overlong penalty)."""

import json
from types import SimpleNamespace

import pytest
import torch
from swe_helpers import write_registry

from propel_core.embedded import EMBEDDED_MODEL_ID
from propel_core.plans import validate_config
from propel_core.plugins import Registry
from propel_core.probes.bundles import save_bundle
from propel_core.probes.heads import TrainedProbe
from propel_core.records import ProbeBundle
from propel_core.run import Run
from propel_core.stages.train import train
from propel_core.training.generator import EpisodeRollouts
from propel_core.training.trainer import load_policy

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def swe_run(tiny_repo, test_env, tmp_path_factory):
    """A run whose probe is an untrained linear head in the bundle format: these tests check what
    reads the trajectory and what trains, not how good the probe is."""
    folder = tmp_path_factory.mktemp("swe-rl")
    registry = Registry.build()
    head = registry.get("probe_architectures", "linear")(576)
    torch.manual_seed(0)
    save_bundle(
        folder / "probe",
        TrainedProbe(head, torch.zeros(576), torch.ones(576), epochs=0),
        ProbeBundle(
            reference_model=EMBEDDED_MODEL_ID,
            layer=8,
            pooling="mean_last_half",
            architecture="linear",
            input_dim=576,
            max_length=512,
            training_rows=0,
            lowest_valid_logit=0.0,  # no corpus: an untrained head, taken to give valid tasks 0 or more
        ),
    )
    repos = write_registry(folder, [{"name": "tinystats", "path": str(tiny_repo), "time_budget": 60}])
    data = {
        "run_dir": str(folder / "run"),
        "domain": {
            "name": "swe",
            "options": {
                "registry": str(repos),
                "preflight_dir": str(folder / "preflight"),
                "max_turns": 2,
                "sandbox_options": {
                    "time_limit": 30,
                    "memory_mb": 2048,
                    "max_processes": 64,
                    "python_env": str(test_env),
                },
            },
        },
        "reward": {"rule": "probe_only", "main_probe": str(folder / "probe")},
        "train": {
            "steps": 1,
            "group_size": 2,
            "per_device_batch": 2,
            "gradient_accumulation": 1,
            "max_completion_length": 96,
            "max_turn_tokens": 24,
            "loss_type": "dapo",
            "overlong_buffer": 16,
            "lr": 1e-3,
            "gradient_checkpointing": False,
        },
        "checkpoint": {"every": 100},
    }
    return Run(validate_config(data, registry), registry, quiet=True)


def test_a_rollout_is_the_whole_trajectory_with_tool_results_masked(swe_run):
    domain = swe_run.domain()
    tokenizer, model, _ = load_policy(swe_run.config.generator)
    (context,) = domain.contexts()
    prompt = tokenizer.apply_chat_template(domain.generator_prompt(context), tokenize=False, add_generation_prompt=True)
    longer_turns = swe_run.config.train.model_copy(update={"max_turn_tokens": 40, "max_completion_length": 160})
    rollouts = EpisodeRollouts(domain, tokenizer, {prompt: context}, longer_turns, seed=0)
    trainer = SimpleNamespace(model=model, accelerator=SimpleNamespace(unwrap_model=lambda m: m))
    torch.manual_seed(0)
    out = rollouts([prompt], trainer)
    (ids,), (mask,), (generation,) = out["completion_ids"], out["env_mask"], out["generation"]
    trajectory = json.loads(generation)
    assert len(ids) == len(mask) <= 160 + 40
    assert out["prompt_ids"][0] == tokenizer(prompt, add_special_tokens=False)["input_ids"]
    said = "".join(turn["assistant"] for turn in trajectory["turns"])
    trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m], skip_special_tokens=True)
    assert trained.replace(" ", "") == said.replace(" ", "")  # the policy's own tokens, and only those, train
    assert len(trajectory["turns"]) == 2  # (seeded) the first reply calls no tool, so a harness message follows
    untrained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    assert trajectory["turns"][0]["output"] in untrained and "<|im_start|>user" in untrained
    assert trajectory["stop_reason"] in ("stop", "max_turns", "length")


def test_grpo_steps_with_multi_turn_rollouts(swe_run):
    train(swe_run)
    folder = swe_run.dir / "train"
    assert (folder / "adapter" / "adapter_model.safetensors").exists()
    (entry,) = [json.loads(line) for line in (folder / "reward_log.jsonl").read_text().splitlines()]
    assert entry["validity_rate"] == 0.0  # a 135M model plants no verified bug in three turns
    assert entry["probe_probability_std"] > 0  # the probe read each finished trajectory
    logged = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    assert any("loss" in row for row in logged)
