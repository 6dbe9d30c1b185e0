"""The loop after the probe: reward scorer, real GRPO steps with LoRA on the embedded model, evaluate,
report and co-evolution."""

import contextlib
import importlib.util
import json
import os
import shutil
import statistics
from dataclasses import replace

import pytest
import torch

from propel_core.config import R_BAD_MARGIN, ModelConfig
from propel_core.domain import CUT_OFF
from propel_core.embedded import EMBEDDED_MODEL_ID
from propel_core.errors import PropelError
from propel_core.execution import solver_labels
from propel_core.plans import validate_config
from propel_core.plugins import Registry
from propel_core.probes.bundles import load_probe, read_bundle
from propel_core.run import Run
from propel_core.stages.evaluate import evaluate
from propel_core.stages.report import report
from propel_core.stages.train import train
from propel_core.training.generator import train_generator
from propel_core.training.generator_reward import COMPLETIONS, RewardScorer, reward_reads, reward_scorer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def probed_run(planted_probe):
    """A run folder with a selected probe, trained on countdown tasks with a planted label."""
    folder = planted_probe
    registry = Registry.build()
    data = {
        "run_dir": str(folder),
        "domain": {"name": "countdown"},
        "probe": {"layers": [8], "poolings": ["mean_full"], "architectures": ["linear"]},
        "train": {
            "steps": 2,
            "group_size": 4,
            "per_device_batch": 4,
            "gradient_accumulation": 1,
            "max_completion_length": 24,
        },
        "checkpoint": {"every": 100},
        # r_bad calibrated from the probe; the paper's 0.0 for a cut-off completion, explicitly: at 24 tokens
        # two steps of countdown may have no valid completion that is not cut off, and a reward that
        # moves has to tell cut-off from invalid there
        "reward": {"overflow_reward": 0.0},
    }
    return Run(validate_config(data, registry), registry, quiet=True)


def scorer_for(run, **options):
    config = run.config
    return reward_scorer(run.services, config.reward, config.train, run.dir / "probes" / "selected", **options)


def test_rewards_follow_the_hard_rule(probed_run, tmp_path):
    scorer = scorer_for(probed_run, log_path=tmp_path / "reward_log.jsonl")
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
    # invalid: calibrated below the lowest logit the probe gives a valid labeled task
    calibrated = scorer.probes[0].bundle.lowest_valid_logit - R_BAD_MARGIN
    assert rewards[1] == pytest.approx(calibrated) and rewards[2] == 0.0  # the explicit overflow reward wins
    assert calibrated < -0.2  # this probe's valid tasks score far below the paper's r_bad
    # the cut-off one is an invalid task, as generate would record it, with no probe score
    (logged,) = [json.loads(line) for line in (tmp_path / COMPLETIONS).read_text().splitlines()]
    cut = logged["completions"][2]
    assert (cut["valid"], cut["reason"], cut["overflow"], cut["probability"]) == (False, CUT_OFF, True, None)


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


@pytest.fixture(scope="module")
def shown_progress():
    """What the training of ``trained_run`` put on the progress bar: (description, total), then each
    advance as (steps, what runs now)."""
    return []


@pytest.fixture(scope="module")
def trained_run(probed_run, shown_progress):
    """``probed_run`` after two real GRPO steps, with the reference's weights from before them."""
    reference = probed_run.registry.backend(ModelConfig())
    before = {name: value.clone() for name, value in reference.model.state_dict().items()}
    shutil.rmtree(probed_run.dir / "train", ignore_errors=True)

    @contextlib.contextmanager
    def progress(description, total):
        shown_progress.append((description, total))
        yield lambda n=1, in_flight=None: shown_progress.append((n, in_flight))

    services = probed_run.services
    probed_run.__dict__["services"] = replace(services, progress=progress)  # the run's, its bar recorded
    try:
        train(probed_run)
    finally:
        probed_run.__dict__["services"] = services
    return probed_run, before


def test_each_step_shows_its_phase_and_the_time_left_on_the_progress_bar(trained_run, shown_progress):
    """Inside a step the bar says what runs and for how long (issue 57: a step sat at 0/N for minutes):
    generating (the policy's completions), scoring (the probe reward), updating (the loss's forward
    and backward passes, the optimizer step); from the second step on, the mean step and the time left."""
    assert shown_progress[0] == ("train", 2)
    advances = shown_progress[1:]
    assert sum(n for n, _ in advances) == 2
    for step in (1, 2):
        phases = [status.split(": ")[1].split()[0] for _, status in advances if status.startswith(f"step {step}/2: ")]
        assert [phase for i, phase in enumerate(phases) if phases[i - 1 : i] != [phase]] == [
            "generating",
            "scoring",
            "updating",
        ]
    assert any(status.startswith("step 2/2: generating") and "s a step, about" in status for _, status in advances)


def test_two_grpo_steps_update_the_adapter_and_not_the_reference(trained_run):
    probed_run, before = trained_run
    reference = probed_run.registry.backend(ModelConfig())
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
    # r_bad, left null, was calibrated from the probe: logged and recorded
    calibrated = read_bundle(probed_run.dir / "probes" / "selected").lowest_valid_logit - R_BAD_MARGIN
    assert all(s["r_bad"] == pytest.approx(calibrated) and s["overflow_reward"] == 0.0 for s in steps)
    recorded = json.loads((probed_run.dir / "settings.json").read_text())["train"]
    assert (recorded["reward.r_bad"], recorded["reward.overflow_reward"]) == (pytest.approx(calibrated), 0.0)
    # another r_bad is another reward: the finished training refuses it, as any reward option
    changed = probed_run.config.reward.model_copy(update={"r_bad": -0.2})
    with pytest.raises(PropelError, match=r"reward.r_bad: -?[0-9.]+ -> -0.2"):
        probed_run.claim("train", True, *reward_reads(probed_run.services, changed))


def test_solver_in_the_loop_runs_the_solver_and_needs_no_probe(probed_run, tmp_path):
    from propel_core.plans import validate_config as validate

    data = probed_run.config.model_dump(mode="json") | {"reward": {"rule": "solver_in_the_loop"}}
    data["label"] = {"k": 2}
    data["solver"] = {"sampling": {"max_new_tokens": 16}}
    run = Run(validate(data, probed_run.registry), probed_run.registry, quiet=True)
    solve = solver_labels(run.services, run.plans.label)
    scorer = scorer_for(run, solve=solve, log_path=tmp_path / "reward_log.jsonl")
    prompt = run.domain().generator_prompt(run.domain().contexts()[0])
    completions = [
        [{"role": "assistant", "content": " 24\nNumbers: 3, 8, 8"}],
        [{"role": "assistant", "content": "??"}],
    ]
    rewards = scorer([prompt] * 2, completions)
    assert rewards[0] in (0.0, 1.0) and rewards[1] == -0.2
    (entry,) = [json.loads(line) for line in (tmp_path / "reward_log.jsonl").read_text().splitlines()]
    assert entry["solver_attempts"] == 2  # k attempts at the one valid task; none at the invalid one
    with pytest.raises(Exception, match="reads probe scores, but no probe bundle was given"):
        RewardScorer(
            probed_run.domain(),
            probed_run.registry.reward_rule("hard", probed_run.config.reward),
            [],
            rule_name="hard",
            rule_options={},
            r_bad=-0.2,
            overflow_reward=0.0,
            max_completion_length=8,
            group_size=2,
        )
    with pytest.raises(Exception, match="reads live solver utility, but no solver was given"):
        scorer_for(run)


def test_partial_instrumentation_through_the_scorer(probed_run):
    from propel_core.plans import validate_config as validate

    data = probed_run.config.model_dump(mode="json")
    data["reward"] = {
        "rule": "partial_instrumentation",
        "options": {"partial_instrumentation": {"valid_score": "logit"}},
    }
    run = Run(validate(data, probed_run.registry), probed_run.registry, quiet=True)
    scorer = scorer_for(run)
    prompt = run.domain().generator_prompt(run.domain().contexts()[0])
    completions = [
        [{"role": "assistant", "content": text}] for text in (" 24\nNumbers: 3, 8, 8", " 99\nNumbers: 1, 1, 1", "?")
    ]
    rewards = scorer([prompt] * 3, completions)
    assert rewards[0] == pytest.approx(scorer.probes[0].score(["Target: 24\nNumbers: 3, 8, 8"])[0]["logit"], abs=1e-4)
    assert rewards[1] == pytest.approx(-10 + 0.1 * 4)  # target line, numbers line, parsed, within the rules
    assert rewards[2] == pytest.approx(-10 + 0.1 * 1)  # the prefilled "Target:" line


def with_config(run, **sections):
    from propel_core.plans import validate_config as validate

    data = run.config.model_dump(mode="json") | sections
    return Run(validate(data, run.registry), run.registry, quiet=True)


@pytest.fixture(scope="module")
def evaluated_run(trained_run):
    run, _ = trained_run
    run = with_config(
        run,
        evaluate={"num_tasks": 6, "k": 2},
        solver={"sampling": {"max_new_tokens": 12}},
        generator={"sampling": {"max_new_tokens": 24}},
    )
    evaluate(run)
    return run


def per_context(folder, arm: str) -> list[float]:
    """1.0 where context i's task of this arm is valid and labeled in band."""
    from propel_core.records import Label, Task, iter_jsonl

    in_band = {label.task_id for label in list(iter_jsonl(folder / arm / "labels.jsonl", Label)) if label.utility == 1}
    tasks = sorted(list(iter_jsonl(folder / arm / "tasks.jsonl", Task)), key=lambda task: task.id)
    return [float(task.validity.valid and task.id in in_band) for task in tasks]


def test_evaluate_compares_base_and_trained_on_the_same_contexts(evaluated_run):
    from propel_core.records import Label, Task, iter_jsonl

    folder = evaluated_run.dir / "eval"
    metrics = json.loads((folder / "metrics.json").read_text())
    assert list(metrics) == ["base", "trained"]
    arms = {arm: sorted(list(iter_jsonl(folder / arm / "tasks.jsonl", Task)), key=lambda t: t.id) for arm in metrics}
    assert [t.context_id for t in arms["base"]] == [t.context_id for t in arms["trained"]]
    assert arms["trained"][0].generator.endswith("train/adapter") and "+" not in arms["base"][0].generator
    for arm, values in metrics.items():
        labels = list(iter_jsonl(folder / arm / "labels.jsonl", Label))
        valid = [t for t in arms[arm] if t.validity.valid]
        assert values["generations"] == 6 and values["valid"] == len(valid) == len(labels) == sum(
            values["solve_counts"]
        )
        assert all(len(label.attempts) == 2 for label in labels)
        assert values["valid_rate"][0] == pytest.approx(len(valid) / 6)
        assert values["utility"][0] == pytest.approx(sum(label.utility == 1 for label in labels) / 6)
        for key in ("self_bleu_3", "distinct_3", "top_topic_share"):
            assert key in values
    assert "| utility (in band / all) |" in (folder / "table.md").read_text()
    shift = metrics["trained"]["vs_base"]  # paired context by context with base
    base_utility, trained_utility = (per_context(folder, arm) for arm in ("base", "trained"))
    assert shift["mean_difference"] == pytest.approx(sum(trained_utility) / 6 - sum(base_utility) / 6)
    assert shift["ci95"][0] <= shift["mean_difference"] <= shift["ci95"][1] and "vs_base" not in metrics["base"]
    assert "| utility - base (paired 95% CI) | - | " in (folder / "table.md").read_text()
    assert (folder / "solve_counts.png").read_bytes().startswith(b"\x89PNG")


def test_report_is_one_self_contained_page_that_leads_with_the_answer(evaluated_run):
    report(evaluated_run)
    page = (evaluated_run.dir / "report.html").read_text()
    for heading in ("Configuration", "Data funnel", "Selected probe", "Training", "Base vs trained", "solve count"):
        assert heading in page
    assert page.count("src='data:image/png;base64,") == 4  # sweep heatmap, reliability, curves, histograms
    assert "src='http" not in page and "not available yet" not in page
    # the verdict (from 6 paired contexts, flagged as few) comes first, the config last and folded
    verdict = page.index("<p class='verdict'>Against the base generator, trained ")
    assert "paired over 6 contexts" in page and "(few contexts: a wide interval)" in page
    assert verdict < page.index("<h2>Probe quality") < page.index("<h2>Configuration</h2><details>")
    # held-out metrics name their rows; a handful of rows is flagged; every cell of the sweep is a row
    assert "on held-out test rows" in page and "rows: too few to tell)" in page
    cells = len((evaluated_run.dir / "probes" / "sweep.csv").read_text().splitlines()) - 1
    sweep = page.split("every cell of the sweep", 1)[1].split("</details>", 1)[0]
    assert sweep.count("<tr>") == cells + 1 and sweep.count(">selected<") == 1


def test_report_shows_the_probe_the_reward_read_from_another_run(evaluated_run, tmp_path):
    """A run trained on another run's probe (reward.main_probe) shows that probe's quality, named by
    its path, not "not available yet"."""
    bundle = evaluated_run.dir / "probes" / "selected"
    run = with_config(
        evaluated_run,
        run_dir=str(tmp_path / "run"),
        reward=evaluated_run.config.reward.model_dump(mode="json") | {"main_probe": str(bundle)},
    )
    run.dir.mkdir()  # the CLI makes a run's folder before its first stage
    report(run)
    section = (tmp_path / "run" / "report.html").read_text().split("<h2>Probe quality</h2>", 1)[1].split("<h2>")[0]
    assert str(bundle) in section and "balanced_accuracy on held-out test rows" in section
    assert "not available yet" not in section and "every cell of the sweep" in section


def test_the_report_shows_what_the_context_sampler_said_last():
    from propel_core.stages.report import sampler_section

    entries = [
        {"step": 0, "sampler": {"buckets_with_data": 1}},
        {"step": 1, "sampler": {"bucket_probabilities": {"a": 0.25, "b": 0.75}, "buckets_with_data": 2}},
        {"step": 2},
    ]
    section = sampler_section(entries)
    assert "at step 2" in section and "a 0.25, b 0.75" in section and "<td>buckets_with_data</td>" in section
    assert sampler_section([{"step": 0}]) == ""


def test_report_names_the_stages_still_to_run(planted_run, tmp_path, propel_registry):
    folder = planted_run(tmp_path)
    run = Run(
        validate_config({"run_dir": str(folder), "domain": {"name": "countdown"}}, propel_registry), propel_registry
    )
    report(run)
    page = (folder / "report.html").read_text()
    assert "<td>in band</td><td class='n'>64</td>" in page
    for stage in ("probe", "train", "evaluate"):
        assert f"run <code>propel {stage}</code>" in page


def test_coevolve_mines_false_positives_and_retrains_with_the_adversarial_rule(evaluated_run, tmp_path):
    from propel_core.records import JsonlWriter, Label, SolverAttempt, Task, iter_jsonl
    from propel_core.stages.coevolve import coevolve

    copy = tmp_path / "run"
    shutil.copytree(evaluated_run.dir, copy, ignore=shutil.ignore_patterns("eval", "checkpoint-*"))
    run = with_config(
        evaluated_run,
        run_dir=str(copy),
        train={**evaluated_run.config.train.model_dump(), "steps": 1},
        coevolve={"dominant_topic": False},
    )
    # the trained policy's solver-labeled tasks: the corpus's own puzzles, none solved in 2 attempts
    corpus = list(iter_jsonl(copy / "tasks.jsonl", Task))[:24]
    main = load_probe(copy / "probes" / "selected", run.registry)
    scores = main.score([task.text for task in corpus])
    (copy / "eval" / "trained").mkdir(parents=True)
    with (
        JsonlWriter(copy / "eval" / "trained" / "tasks.jsonl") as tasks,
        JsonlWriter(copy / "eval" / "trained" / "labels.jsonl") as labels,
    ):
        for task in corpus:
            tasks.write(task)
            labels.write(Label.from_attempts(task.id, [SolverAttempt(text="", solved=False)] * 2, (1 / 8, 3 / 8), 1))
    coevolve(run)
    expected = sum(score["probability"] >= 0.5 for score in scores)
    auxiliary = json.loads((copy / "coevolve" / "auxiliary" / "probe.json").read_text())
    in_band = sum(label.utility == 1 for label in list(iter_jsonl(copy / "labels.jsonl", Label)))
    assert expected > 0 and auxiliary["training_rows"] == int(0.8 * (in_band + expected))
    assert (auxiliary["layer"], auxiliary["pooling"]) == (main.bundle.layer, main.bundle.pooling)
    assert (copy / "coevolve" / "train" / "adapter" / "adapter_model.safetensors").exists()
    (step,) = [json.loads(line) for line in (copy / "coevolve" / "train" / "reward_log.jsonl").read_text().splitlines()]
    assert 0 <= step["validity_rate"] <= 1


@pytest.fixture(scope="module")
def other_family_policy(tmp_path_factory):
    """A tiny GPT-2 with its own byte-level BPE tokenizer (300 tokens) and chat template: another
    model family than the SmolLM2 reference, random weights."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("gpt2-policy")
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<pad>", "<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(["Target: 24\nNumbers: 3, 8, 8", "Write one new puzzle with 4 numbers."] * 20, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>")
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=1024,
        n_embd=32,
        n_layer=2,
        n_head=2,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_cold_transfer_trains_another_family_against_the_fixed_probe(probed_run, other_family_policy, tmp_path):
    from safetensors.torch import load_file

    run = with_config(
        probed_run,
        generator={"model": str(other_family_policy)},
        train={**probed_run.config.train.model_dump(), "steps": 1},
        lora={"target_modules": ["c_attn", "c_proj", "c_fc"]},
    )
    train_in(run, tmp_path / "train")
    adapter = load_file(tmp_path / "train" / "adapter" / "adapter_model.safetensors")
    assert any("c_attn" in name for name in adapter) and not any("q_proj" in name for name in adapter)
    (step,) = [json.loads(line) for line in (tmp_path / "train" / "reward_log.jsonl").read_text().splitlines()]
    assert 0 <= step["validity_rate"] <= 1
    # the reward came from the SmolLM2 reference the probe was trained on, whatever wrote the text
    assert load_probe(probed_run.dir / "probes" / "selected").bundle.reference_model == EMBEDDED_MODEL_ID


def test_rank_learns_the_planted_ordering_and_refreshes_on_policy_tasks(probed_run, tmp_path):
    from propel_core.records import JsonlWriter, Label, SolverAttempt, Task, iter_jsonl
    from propel_core.stages.rank import rank

    copy = tmp_path / "run"
    shutil.copytree(probed_run.dir, copy, ignore=shutil.ignore_patterns("train", "eval", "coevolve"))
    run = with_config(probed_run, run_dir=str(copy))
    rank(run)
    summary = json.loads((copy / "ranker" / "metrics.json").read_text())
    assert summary["before"] is None and summary["held_out_pairs"] > 0
    assert summary["after"]["pair_accuracy"] > 0.7  # in band = target above the median: readable
    scorer = load_probe(copy / "ranker", run.registry)
    high, low = scorer.score(["Target: 900\nNumbers: 25, 36, 1", "Target: 4\nNumbers: 2, 2, 1"])
    assert high["logit"] > low["logit"]
    # on-policy refresh: the "trained policy" wrote the corpus's tasks, and its solver found the
    # opposite ordering (low targets in band): the refresh must move the ranker towards it
    (copy / "eval" / "trained").mkdir(parents=True)
    tasks = list(iter_jsonl(copy / "tasks.jsonl", Task))
    labels = {label.task_id: label for label in list(iter_jsonl(copy / "labels.jsonl", Label))}
    with (
        JsonlWriter(copy / "eval" / "trained" / "tasks.jsonl") as task_out,
        JsonlWriter(copy / "eval" / "trained" / "labels.jsonl") as label_out,
    ):
        for task in tasks:
            task_out.write(task)
            solved = 0 if labels[task.id].utility else 2
            attempts = [SolverAttempt(text="", solved=j < solved) for j in range(8)]
            label_out.write(Label.from_attempts(task.id, attempts, (1 / 8, 3 / 8), 1))
    rank(with_config(run, rank={"refresh": True, "epochs": 40}))
    refresh = json.loads((copy / "ranker" / "refresh.json").read_text())
    assert refresh["before"]["pair_accuracy"] < 0.3 < refresh["after"]["pair_accuracy"]


def test_grpo_with_replay_and_the_progress_sampler(probed_run, tmp_path):
    train_config = {
        **probed_run.config.train.model_dump(),
        "steps": 2,
        "replay": {"strategy": "top_k", "min_reward": -100.0, "comparison": ">=", "slots": 1},
    }
    generate = {"context_sampler": "progress", "sampler_options": {"buckets": "prompt"}}
    domain = {"name": "countdown", "options": {"num_contexts": 1}}  # one prompt: step 2 repeats step 1's
    run = with_config(probed_run, train=train_config, generate=generate, domain=domain)
    train_in(run, tmp_path / "train")
    first, second = [json.loads(line) for line in (tmp_path / "train" / "reward_log.jsonl").read_text().splitlines()]
    assert (first["replayed"], first["replay_admitted"]) == (0, 4)  # every reward >= -100 is admitted
    assert (second["replayed"], second["replay_admitted"]) == (1, 7)  # one slot replayed, three fresh admitted
    assert second["sampler"]["buckets_with_data"] == 1  # the trainer fed the rewards back to the sampler
    assert second["sampler"]["bucket_probabilities"] == {"countdown-000": 1.0}


def train_in(run, folder):
    """The train stage's GRPO loop on ``run``'s config, into ``folder``."""
    train_generator(run.services, replace(run.plans.train, folder=folder, checkpoint_every=100, resume=False))


def test_grpo_rollouts_end_at_the_generators_stop_string(probed_run, tmp_path):
    """TRL's transformers generation stops each rollout at ``generator.sampling.stop``, as generate's
    backends do. The reward log cannot show it (the scorer cuts every completion's text at the stop
    string), so the test reads TRL's token counts: with the stop at the end of a countdown puzzle's
    first line, every rollout ends within a few tokens. Rollouts that ran past the stop string would
    reach the 24-token limit: without it, 7 of these 8 did (the numbers line runs on)."""
    generator = probed_run.config.generator.model_dump(mode="json")
    generator["sampling"]["stop"] = ["\n"]
    run = with_config(probed_run, generator=generator)
    folder = tmp_path / "stopped"
    train_generator(run.services, replace(run.plans.train, folder=folder, checkpoint_every=100, resume=False))
    steps = [entry for line in (folder / "log.jsonl").read_text().splitlines() if "loss" in (entry := json.loads(line))]
    limit = run.config.train.max_completion_length
    assert len(steps) == 2 and all(step["completions/max_length"] < limit / 2 for step in steps), steps
    sampled = [c for line in (folder / COMPLETIONS).read_text().splitlines() for c in json.loads(line)["completions"]]
    assert len(sampled) == 8 and not any(c["overflow"] for c in sampled), sampled


#: the vLLM train test's learning rate, and the mean log-probability gap between engine and policy it
#: allows at the second step: with the sync, 0.037 in a trial of this size; with the engine left on the
#: base weights, 0.083 (and 0.099 a step later)
VLLM_LR, VLLM_GAP = 2e-3, 0.06


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (scripts/setup.sh)")
def test_two_grpo_steps_with_vllm_rollouts(probed_run, tmp_path):
    """TRL's colocate mode on vLLM's CPU build: rollouts from the engine, the LoRA-merged weights
    synced into it each step (propel's sync on a CPU build), the adapter saved. The learning rate is
    high enough that the policy moves in one step: an engine left on the old weights would sample
    what the policy no longer would, and TRL's log-probability gap would show it. The engine stops at
    the generator's stop string, as generate's backends do."""
    from propel_core.training.generator import train_generator

    settings = probed_run.config.train.model_dump(mode="json") | {"use_vllm": True, "lr": VLLM_LR}
    generator = probed_run.config.generator.model_dump(mode="json")
    generator["sampling"]["stop"] = ["\n\n"]
    run = with_config(probed_run, train=settings, generator=generator)
    folder = tmp_path / "vllm"
    cores, threads, set_threads = os.sched_getaffinity(0), torch.get_num_threads(), torch.set_num_threads
    distributed = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "VLLM_CPU_KVCACHE_SPACE")
    environment = {name: os.environ.get(name) for name in distributed}
    train_generator(run.services, replace(run.plans.train, folder=folder, checkpoint_every=100, resume=False))
    # TRL and vLLM set distributed variables, and vLLM's CPU worker, in this process, bound it to its cores
    # and disabled torch.set_num_threads: all given back (a `propel train` started after saw RANK and died)
    assert {name: os.environ.get(name) for name in distributed} == environment
    assert os.sched_getaffinity(0) == cores and torch.get_num_threads() == threads
    assert torch.set_num_threads is set_threads
    assert (folder / "adapter" / "adapter_model.safetensors").exists()
    steps = [json.loads(line) for line in (folder / "reward_log.jsonl").read_text().splitlines()]
    assert len(steps) == 2
    sampled = [json.loads(line) for line in (folder / COMPLETIONS).read_text().splitlines()]
    assert not any("\n\n" in c["generation"] for entry in sampled for c in entry["completions"])
    logged = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    gaps = [entry["sampling/sampling_logp_difference/mean"] for entry in logged if "loss" in entry]
    assert len(gaps) == 2 and gaps[1] < VLLM_GAP, gaps


def test_vllm_server_mode_without_cuda_is_refused_before_any_model_loads(probed_run):
    from propel_core.training.generator import _check

    settings = probed_run.config.train.model_dump(mode="json") | {"use_vllm": True, "vllm_mode": "server"}
    run = with_config(probed_run, train=settings)
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: server mode can run")
    with pytest.raises(Exception, match=r"train\.vllm_mode: server needs CUDA GPUs"):
        _check(run.domain(), run.config.train, audited=False)


def test_grpo_that_learns_nothing_says_so(trained_run, tmp_path, caplog):
    """A completion limit of 2 tokens cuts off every completion, so each earns the overflow reward and
    every group is of one reward: after STALL_STEPS steps training says so in one line naming the
    setting, the reward log and the report show it, and the reward log reads as one that never moved
    (the sentence the closing line ends with)."""
    from propel_core.stages.report import training_section
    from propel_core.training.feedback import STALL_STEPS, logged_steps, reward_never_moved

    probed_run, _ = trained_run
    settings = probed_run.config.train.model_dump(mode="json") | {"steps": STALL_STEPS, "max_completion_length": 2}
    run = with_config(probed_run, train=settings)
    folder = tmp_path / "train"
    with caplog.at_level("WARNING", logger="propel"):
        train_in(run, folder)
    said = [record.getMessage() for record in caplog.records if "length limit" in record.getMessage()]
    assert len(said) == 1 and "raise train.max_completion_length" in said[0], said
    assert f"steps 1-{STALL_STEPS} 100% or more of the completions hit the length limit (2 tokens)" in said[0]
    entries = [json.loads(line) for line in (folder / "reward_log.jsonl").read_text().splitlines()]
    assert [entry["cut_off"] for entry in entries] == [1.0] * STALL_STEPS
    assert [entry["degenerate_groups"] for entry in entries] == [1.0] * STALL_STEPS
    assert [bool(entry.get("alarm")) for entry in entries] == [False] * (STALL_STEPS - 1) + [True]
    assert "Alarm: train: in steps 1-" in training_section(tmp_path, run.registry, STALL_STEPS)
    assert reward_never_moved(entries).startswith("the reward never moved: every completion")
    assert reward_never_moved(logged_steps(probed_run.dir / "train" / "reward_log.jsonl")) is None  # it moved


def test_the_alarm_waits_for_steps_in_a_row_and_names_the_cause():
    """Signs below the share, or a streak broken, say nothing; a streak of groups of one reward names
    group size, and says so once a streak."""
    from propel_core.training.feedback import STALL_STEPS, Stall

    stall = Stall("solve_train", group_size=2, limit=4)
    short, long = [False] * 4, [True] * 4
    varied, flat = [0.0, 1.0, 0.0, 1.0], [0.5, 0.5, 1.0, 1.0]
    assert stall.signs(varied, long) == {"cut_off": 1.0, "degenerate_groups": 0.0}
    assert stall.signs(flat, short) == {"cut_off": 0.0, "degenerate_groups": 1.0}
    said = [stall.alarm(step, stall.signs(flat, short)) for step in range(STALL_STEPS - 1)]
    said.append(stall.alarm(STALL_STEPS - 1, stall.signs(varied, short)))  # the streak breaks
    said += [stall.alarm(step, stall.signs(flat, short)) for step in range(STALL_STEPS, 3 * STALL_STEPS)]
    alarms = [(step, line) for step, line in enumerate(said) if line]
    assert len(alarms) == 1 and alarms[0][0] == 2 * STALL_STEPS - 1, alarms
    assert "all 2 of their completions one reward" in alarms[0][1] and "raise solve_train.group_size" in alarms[0][1]
    assert Stall("train", None, None).signs(flat, []) == {}


def test_the_length_limit_cuts_only_what_neither_an_end_token_nor_a_stop_string_ended():
    """As the backends judge a generation in generate: a completion of the limit's length is cut off
    unless its last token ends it or it wrote a stop string (TRL keeps the stop string in the text)."""
    from propel_core.training.feedback import Stall, generations

    stall = Stall("train", group_size=2, limit=4, stop=["\n"])
    stall.ends = {0}
    ids = [[5, 6], [5, 6, 7, 8], [5, 6, 7, 0], [5, 6, 7, 8]]
    completions = [" 1 + 2", " 1 + 2 * 3", " 1 + 2", " 1 + 2\nCompute"]
    assert stall.cut_off(ids, completions) == [False, True, False, False]
    assert generations(["p"] * 4, completions, ["Compute:"] * 4, stall.stop)[3] == "Compute: 1 + 2"
    assert Stall("train", 2, None).cut_off(ids, completions) == [] and stall.cut_off(None, completions) == []


def test_a_resumed_training_takes_up_its_streaks_from_the_reward_log(tmp_path):
    """A streak already said before the checkpoint is not said again after a resume; one that spans
    the resume is said on the step that completes it."""
    from propel_core.training.feedback import STALL_STEPS, Stall, logged_steps

    log_path = tmp_path / "reward_log.jsonl"
    stalled = {"cut_off": 1.0, "degenerate_groups": 1.0}
    for logged, said_at in [(STALL_STEPS, None), (STALL_STEPS - 1, STALL_STEPS - 1)]:
        log_path.write_text("".join(json.dumps({"step": step} | stalled) + "\n" for step in range(logged)))
        stall = Stall("train", group_size=4, limit=2)
        stall.resume(logged_steps(log_path))
        said = {step: stall.alarm(step, stalled) for step in range(logged, logged + 2)}
        assert [step for step, line in said.items() if line] == ([] if said_at is None else [said_at])


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (scripts/setup.sh)")
def test_the_colocated_engine_is_eager_where_the_setting_says():
    """On a CPU build TRL's engine is built eager unless train.vllm_enforce_eager says false; TRL's
    own LLM is back once the trainer is built, and nothing changes without use_vllm."""
    from trl.generation import vllm_generation

    from propel_core.training.generator import colocated_engine

    engine, cpu = vllm_generation.LLM, not torch.cuda.is_available()
    for use_vllm, setting, eager in [(True, None, cpu), (True, True, True), (True, False, False), (False, True, False)]:
        with colocated_engine(use_vllm, setting):
            built = vllm_generation.LLM
            if eager:
                assert built.func is engine and built.keywords == {"enforce_eager": True}
            else:
                assert built is engine
        assert vllm_generation.LLM is engine


def test_zero_variance_drop_leaves_the_groups_of_one_reward_out_of_the_loss(trained_run, tmp_path):
    """train.zero_variance: drop with the dapo loss: each step's share of completions left out of the
    loss (TRL's log) is its share of groups of one reward (the reward log); refill: each step's reward
    log entry says how many groups were flat, refilled from further draws (at most max_refills) and
    dropped, as TRL's log does; with a loss that is not normalized by the batch's tokens, or beside the
    overlong penalty, either is refused before anything runs."""
    probed_run, _ = trained_run
    settings = probed_run.config.train.model_dump(mode="json") | {"loss_type": "dapo", "zero_variance": "drop"}
    train_in(with_config(probed_run, train=settings), tmp_path)
    steps = [json.loads(line) for line in (tmp_path / "reward_log.jsonl").read_text().splitlines()]
    logged = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    dropped = [entry["zero_variance/dropped"] for entry in logged if "zero_variance/dropped" in entry]
    assert dropped == pytest.approx([step["degenerate_groups"] for step in steps]) and len(dropped) == 2
    refilling = settings | {"zero_variance": "refill", "max_refills": 1}
    train_in(with_config(probed_run, train=refilling), tmp_path / "refill")
    steps = [json.loads(line) for line in (tmp_path / "refill" / "reward_log.jsonl").read_text().splitlines()]
    logged = [json.loads(line) for line in (tmp_path / "refill" / "log.jsonl").read_text().splitlines()]
    draws = [entry["zero_variance/draws"] for entry in logged if "zero_variance/draws" in entry]
    assert [step["step"] for step in steps] == [0, 1] and draws == [len(s["zero_variance"]["draws"]) for s in steps]
    for step in steps:  # a step of 4 completions in one group
        counts = step["zero_variance"]
        assert counts["flat"] == step["degenerate_groups"] and counts["refilled"] + counts["dropped"] == counts["flat"]
        assert len(counts["draws"]) == counts["flat"]  # a flat group draws once (max_refills: 1)
    with pytest.raises(PropelError, match=r"zero_variance: refill needs a loss normalized by the batch's tokens"):
        with_config(probed_run, train=refilling | {"loss_type": "bnpo"})
    with pytest.raises(PropelError, match="overlong_buffer adds a length penalty"):
        with_config(probed_run, train=settings | {"overlong_buffer": 4})


def test_the_model_card_names_the_base_and_its_tags_in_order(trained_run):
    """TRL's card names a base only by a hub id, so the embedded default's converted weights read
    "[None]"; the card names where the weights came from instead, and sorts TRL's tags."""
    from propel_core.embedded import model_source

    probed_run, _ = trained_run
    card = (probed_run.dir / "train" / "README.md").read_text()
    assert f"This model is trained from {model_source(None)}." in card and "[None]" not in card
    after = card.split("tags:\n", 1)[1].splitlines()
    tags = after[: next(i for i, line in enumerate(after) if not line.startswith("- "))]
    assert tags == sorted(tags) and "- grpo" in tags
