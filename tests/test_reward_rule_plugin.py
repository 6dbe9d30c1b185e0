"""A third-party reward rule with an option, as a plugin author meets it through the `propel` command:
its options are checked when the config is read, the rule that trained an adapter is logged, named in
TRL's metric, recorded in settings.json and shown in the report, and a changed rule (or option) on a
finished training is refused, not silently ignored."""

import json

import pytest


def config_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        f"run_dir: {tmp_path}\ndomain: {{name: reverse_word}}\n"
        "reward: {rule: length_bonus, options: {length_bonus: {per_letter: 0.5}}}\n"
        "train: {steps: 2, group_size: 2, per_device_batch: 2, gradient_accumulation: 1,\n"
        "        max_completion_length: 8, gradient_checkpointing: false}\ncheckpoint: {every: 1}\n"
    )
    return str(path)


def test_the_rules_options_are_checked_when_the_config_is_read(example_reward_plugin, propel_cli, tmp_path):
    """A misspelt option, a value of the wrong type and options of a rule nobody installed each give
    one line before any model loads; so do the other components' options."""
    cfg = config_file(tmp_path)
    typo = propel_cli("generate", cfg, "reward.options.length_bonus.per_lettr=1", check=False)
    assert typo.returncode == 1
    assert (
        "reward.options.length_bonus: reward rule 'length_bonus' takes no option 'per_lettr'; its options: "
        "per_letter (did you mean 'per_letter'?)" in typo.stderr
    )
    assert "Traceback" not in typo.stderr and not (tmp_path / "tasks.jsonl").exists()
    wrong_type = propel_cli("generate", cfg, "reward.options.length_bonus.per_letter=lots", check=False)
    assert (
        "reward rule 'length_bonus' option 'per_letter' = 'lots': Input should be a valid number" in wrong_type.stderr
    )
    unknown = propel_cli("generate", cfg, "reward.options.length_bonuss.per_letter=1", check=False)
    assert "reward.options.length_bonuss: unknown reward rule 'length_bonuss'" in unknown.stderr
    assert "(did you mean 'length_bonus'?)" in unknown.stderr
    domain = propel_cli("generate", cfg, "domain.options.min_leters=3", check=False)
    assert "domain 'reverse_word' takes no option 'min_leters'; its options: min_letters, max_letters" in domain.stderr
    sampler = propel_cli(
        "generate", cfg, "generate.context_sampler=progress", "generate.sampler_options.seed=3", check=False
    )
    assert "context sampler 'progress' option 'seed' is set by propel itself" in sampler.stderr
    backend = propel_cli("generate", cfg, "generator.options.timeout=9", check=False)
    assert "model backend 'transformers' takes no option 'timeout'; its options: (none)" in backend.stderr
    assert all(r.returncode == 1 for r in (wrong_type, unknown, domain, sampler, backend))


@pytest.mark.slow
def test_the_rule_that_trained_an_adapter_is_enforced_and_shown(example_reward_plugin, propel_cli, tmp_path):
    from propel_reverse_word import ReverseWord

    cfg = config_file(tmp_path)
    propel_cli("-q", "train", cfg)
    folder = tmp_path / "train"
    entries = [json.loads(line) for line in (folder / "reward_log.jsonl").read_text().splitlines()]
    assert [(e["step"], e["rule"], e["rule_options"]) for e in entries] == [
        (0, "length_bonus", {"per_letter": 0.5}),
        (1, "length_bonus", {"per_letter": 0.5}),
    ]
    metrics = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    assert any("rewards/length_bonus/mean" in m for m in metrics)
    # the sampled completions carry the rewards the rule gave them, with its option
    calls = [json.loads(line) for line in (folder / "completions.jsonl").read_text().splitlines()]
    assert [c["step"] for c in calls] == [0, 1] and all(c["rule"] == "length_bonus" for c in calls)
    for completion in (c for call in calls for c in call["completions"]):
        if completion["overflow"]:  # cut off at 8 tokens: overflow_reward, whatever the rule says
            assert completion["reward"] == 0.0
        elif completion["valid"]:
            word = ReverseWord().parse(completion["generation"])["word"]  # as the domain read it
            assert completion["reward"] == pytest.approx(0.5 * len(word))
        else:
            assert completion["reward"] == -0.2
    recorded = json.loads((tmp_path / "settings.json").read_text())["train"]
    assert recorded["reward.rule"] == "length_bonus" and recorded["reward.options.length_bonus.per_letter"] == 0.5
    assert (recorded["reward.r_bad"], recorded["reward.overflow_reward"]) == (-0.2, 0.0)  # settled, not null

    # on the finished training, another option or another rule is refused with one line, not "nothing to train"
    option = propel_cli("-q", "train", cfg, "reward.options.length_bonus.per_letter=2", check=False)
    assert option.returncode == 1 and "nothing to train" not in option.stderr
    assert "train was made with other settings (reward.options.length_bonus.per_letter: 0.5 -> 2.0)" in option.stderr
    rule = propel_cli("-q", "train", cfg, "reward.rule=soft", check=False)
    assert rule.returncode == 1 and 'reward.rule: "length_bonus" -> "soft"' in rule.stderr
    assert "reward.main_probe=" in rule.stderr  # the way to train it beside this run, on this run's probe
    assert json.loads((tmp_path / "settings.json").read_text())["train"] == recorded

    propel_cli("-q", "report", cfg)
    page = (tmp_path / "report.html").read_text()
    # the rule in words (its docstring), its option, and what it paid an invalid and a cut-off generation:
    # the paper's values, as it reads no logit
    said = (
        "Rewarded by the <code>length_bonus</code> rule at steps 1-2 of 2 planned: per_letter for each letter "
        "of a valid task&#x27;s word, r_bad for an invalid one (options per_letter 0.5; it paid an invalid "
        "generation r_bad -0.2 and a cut-off one overflow reward 0).</p>"
    )
    assert said in page
    assert "Completions of the last step (1), sampled" in page
