"""What a config will spend (propel_core/estimate.py, printed by `propel config`): counts from the
plans, minutes from the benchmarks' rates, unknown where no benchmark measured a role or a domain."""

import json
from importlib.resources import files

import pytest
import yaml

from propel_core.config import LabelConfig, SolveTrainConfig, TrainConfig
from propel_core.estimate import estimate, estimate_lines
from propel_core.plans import load_config, plans_of, validate_config
from propel_core.plugins import Registry

DEMO = files("propel_core") / "configs" / "demo.yaml"
DEMO_FIGURE = files("propel_core") / "configs" / "demo_figure.json"
SPENDING = ("generations", "attempts", "rollouts", "tokens", "seconds")


@pytest.fixture(scope="module")
def registry():
    return Registry.build()


@pytest.fixture
def paper(tmp_path):
    """A config that names only a domain: every other setting the paper's default."""
    path = tmp_path / "paper.yaml"
    path.write_text("domain: {name: arithmetic}\n")
    return path


def spend(registry, path, *overrides):
    config = load_config(str(path), list(overrides), registry)
    return estimate(config, plans_of(config), registry)


def numbers(stage) -> tuple:
    return tuple(getattr(stage, name) for name in SPENDING)


def test_the_demo_counts_are_its_plans(registry):
    """demo.yaml: 512 generations of up to 20 tokens, K = 16, 20 GRPO steps of 8 rollouts audited
    every 5 steps (8 tasks x K = 16, at steps 0, 5, 10, 15), 256 tasks per arm at K = 16."""
    found = spend(registry, DEMO)
    generate, label, train, evaluate = (found.stage(name) for name in ("generate", "label", "train", "evaluate"))
    assert (generate.generations, generate.tokens) == (512, 512 * 20)
    assert (label.attempts, label.tokens) == (512 * 16, 512 * 16 * 16)
    assert (train.rollouts, train.attempts, train.tokens) == (20 * 8, 4 * 8 * 16, 20 * 8 * 20 + 4 * 8 * 16 * 16)
    assert (evaluate.generations, evaluate.attempts) == (2 * 256, 2 * 256 * 16)
    total = found.total
    assert total.attempts == label.attempts + train.attempts + evaluate.attempts
    assert total.generations == 512 + 2 * 256  # the corpus and the two arms
    assert found.complete and not [note for note in found.notes if note.startswith(("generator", "solver", "domain"))]


def test_the_demo_estimate_is_within_a_factor_of_two_of_its_measured_time(registry):
    """The bound (every generation valid: the demo's corpus was 46% valid) against the 35.7 minutes the
    demo took (demo_figure.json)."""
    minutes = spend(registry, DEMO).total.seconds / 60
    measured = json.loads(DEMO_FIGURE.read_text())["minutes"]
    assert 0.5 < minutes / measured < 2, (minutes, measured)


def test_the_estimate_scales_with_the_settings(registry, paper):
    """The paper's defaults: 1,024 tasks per arm at K = 8, 50 steps x 64 rollouts of 512 tokens, which
    run for days on a CPU; doubling a stage's setting doubles that stage and leaves the others."""
    found = spend(registry, paper)
    assert found.stage("evaluate").attempts == 2 * 1024 * 8
    assert (found.stage("train").rollouts, found.stage("train").tokens) == (50 * 64, 50 * 64 * 512)
    assert found.total.seconds > 2 * 24 * 3600
    for override, stage in (
        ("evaluate.num_tasks=2048", "evaluate"),
        ("train.steps=100", "train"),
        ("label.k=16", "label"),
    ):
        doubled = spend(registry, paper, override)
        assert numbers(doubled.stage(stage)) == pytest.approx(tuple(2 * n for n in numbers(found.stage(stage))))
        others = [(numbers(s), numbers(doubled.stage(s.name))) for s in found.stages if s.name != stage]
        assert all(before == after for before, after in others), override


def test_a_rule_reading_the_solver_spends_k_attempts_a_rollout(registry, paper):
    found = spend(registry, paper, "reward.rule=solver_in_the_loop")
    assert found.stage("train").attempts == 50 * 64 * 8
    assert spend(registry, paper).stage("train").attempts == 0


def test_roles_and_domains_no_benchmark_timed_leave_minutes_unknown_and_say_why(registry, paper):
    other = spend(registry, paper, "generator.model=HuggingFaceTB/SmolLM2-360M-Instruct")
    assert [s.name for s in other.stages if s.seconds is None] == ["generate", "extract", "train", "evaluate"]
    assert any("SmolLM2-360M-Instruct was not timed" in note for note in other.notes)
    assert other.stage("label").attempts == spend(registry, paper).stage("label").attempts  # counts stay
    assert ">=" in next(line for line in estimate_lines(other) if line.lstrip().startswith("total"))

    served = spend(registry, paper, "solver.backend=openai")
    assert served.stage("label").seconds is None and any("openai backend" in note for note in served.notes)
    math = spend(registry, paper, "domain.name=math")
    assert math.stage("label").seconds is None and any(note.startswith("domain math") for note in math.notes)

    embedded = spend(registry, paper).stage("label").seconds
    vllm = spend(registry, paper, "solver.backend=vllm")
    assert vllm.stage("label").seconds == pytest.approx(embedded / 0.88)  # scaled, and said so
    assert any("vllm_label.py" in note for note in vllm.notes)
    assert spend(registry, paper, "solver.backend=arithmetic_skill").stage("label").seconds == 0
    azr = spend(registry, paper, "domain.name=azr").stage("label").seconds
    assert azr == pytest.approx(embedded + 64 * 8 / 16.2)  # a sandboxed check at each of 64 x 8 attempts


def test_propel_config_prints_the_estimate_after_the_config(propel_cli, tmp_path):
    """On stderr, so what stdout prints stays the config (it reads back, and is RUN/config.yaml)."""
    shown = propel_cli("config", str(DEMO), f"run_dir={tmp_path / 'run'}")
    assert yaml.safe_load(shown.stdout)["evaluate"]["num_tasks"] == 256 and "spends" not in shown.stdout
    lines = shown.stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("what this config spends"))
    table = {line.split()[0]: line.split()[1:] for line in lines[start + 2 : start + 10]}
    assert table["label"][:4] == ["0", "8,192", "0", "131,072"]
    assert table["evaluate"][:2] == ["512", "8,192"] and table["total"][1] == "16,896"
    assert any(line.startswith("  - rollout: ") and "train_busy.py" in line for line in lines)
    # a new user's trial (issue 60) read 1.0 minutes for small/arithmetic and waited 7.7: the start-up is named
    assert lines[start + 10].startswith("  not counted: starting each stage and loading its models")


def test_rounds_count_each_round_and_the_generator_trainings_its_setting_asks_for():
    def rounds(**options):
        config = validate_config({"domain": {"name": "arithmetic"}, "rounds": options})
        return estimate(config, plans_of(config), Registry.build()).stage("rounds")

    every, once = rounds(num_rounds=3), rounds(num_rounds=3, generator="first_round")
    train, solve = TrainConfig(), SolveTrainConfig()
    per_training = train.steps * train.per_device_batch * train.gradient_accumulation
    assert every.rollouts - once.rollouts == 2 * per_training
    assert every.rollouts == 3 * per_training + 3 * solve.steps * solve.per_device_batch
    k = LabelConfig().k
    assert every.attempts == 3 * 16 * k * 2 + 4 * 32 * solve.eval_k  # two labelings a round, held out 3 + 1 times
    assert rounds(num_rounds=3, audit_previous=False).attempts == every.attempts - 3 * 16 * k
    assert every.generations == 3 * 64
