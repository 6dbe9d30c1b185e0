"""Config: YAML + overrides, paper defaults, and errors that name key, value and valid choices."""

import pytest

from propel_core.config import ConfigError
from propel_core.plans import load_config, validate_config


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("domain:\n  name: countdown\nlabel:\n  k: 4\nrun_dir: ${oc.env:HOME}/runs/x\n")
    return path


def test_paper_defaults(propel_registry):
    config = validate_config({"domain": {"name": "countdown"}}, propel_registry)
    assert (config.label.k, config.label.band_low, config.label.band_high) == (8, 1 / 8, 3 / 8)
    assert (config.solver.sampling.temperature, config.solver.sampling.top_p, config.solver.sampling.top_k) == (
        0.6,
        0.95,
        20,
    )
    assert (config.probe.lr, config.probe.weight_decay, config.probe.batch_size) == (1e-3, 1e-4, 64)
    assert (config.probe.epochs, config.probe.patience) == (50, 7)
    assert (config.lora.r, config.lora.alpha, config.lora.dropout) == (16, 32, 0.05)
    assert len(config.lora.target_modules) == 7
    assert (config.reward.rule, config.reward.r_bad) == ("hard", None)  # null: calibrated from the probe
    assert config.generator.model is None  # the embedded default


def test_yaml_then_overrides(config_file, propel_registry, monkeypatch):
    monkeypatch.setenv("HOME", "/home/someone")
    config = load_config(config_file, ["label.k=3", "reward.rule=soft", "solver.sampling.top_k=5"], propel_registry)
    assert config.label.k == 3
    assert config.reward.rule == "soft"
    assert config.solver.sampling.top_k == 5
    assert str(config.run_dir) == "/home/someone/runs/x"


ROLE_SAMPLING = {
    "generator": {"temperature": 1.0, "top_p": 0.95, "top_k": 0, "max_new_tokens": 512, "stop": []},
    "solver": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 1024, "stop": []},
}


@pytest.mark.parametrize("role", sorted(ROLE_SAMPLING))
@pytest.mark.parametrize("how", ["yaml", "override"])
def test_one_sampling_key_keeps_the_roles_other_defaults(role, how, tmp_path, propel_registry):
    path = tmp_path / "run.yaml"
    path.write_text("domain:\n  name: countdown\n")
    if how == "yaml":
        path.write_text(path.read_text() + f"{role}:\n  sampling: {{max_new_tokens: 64}}\n")
    config = load_config(path, [f"{role}.sampling.max_new_tokens=64"] if how == "override" else [], propel_registry)
    assert getattr(config, role).sampling.model_dump() == {**ROLE_SAMPLING[role], "max_new_tokens": 64}


@pytest.mark.parametrize("role", sorted(ROLE_SAMPLING))
def test_other_role_keys_keep_the_sampling_defaults(role, tmp_path, propel_registry):
    path = tmp_path / "run.yaml"
    path.write_text(f"domain:\n  name: countdown\n{role}:\n  model: Qwen/Qwen2.5-3B\n  sampling:\n    top_p: 0.5\n")
    config = load_config(path, [f"{role}.batch_size=2", f"{role}.sampling.temperature=0.1"], propel_registry)
    section = getattr(config, role)
    assert (section.model, section.batch_size) == ("Qwen/Qwen2.5-3B", 2)
    assert section.sampling.model_dump() == {**ROLE_SAMPLING[role], "top_p": 0.5, "temperature": 0.1}


def test_reference_defaults_to_generator(propel_registry):
    config = validate_config(
        {"domain": {"name": "countdown"}, "generator": {"model": "Qwen/Qwen2.5-3B"}}, propel_registry
    )
    assert config.reference.model == "Qwen/Qwen2.5-3B"
    cold = validate_config(
        {"domain": {"name": "countdown"}, "generator": {"model": "a"}, "reference": {"model": "b"}}, propel_registry
    )
    assert cold.reference.model == "b"


def test_wrong_reward_name_lists_installed(config_file, propel_registry):
    with pytest.raises(ConfigError) as err:
        load_config(config_file, ["reward.rule=wc0"], propel_registry)
    assert (
        "reward.rule: unknown reward rule 'wc0'; installed: adversarial, hard, partial_instrumentation, probe_only, soft, solver_in_the_loop, wco"
        in str(err.value)
    )


def test_unknown_key_lists_valid_keys(config_file, propel_registry):
    with pytest.raises(ConfigError) as err:
        load_config(config_file, ["generator.sampling.tempreature=0.5"], propel_registry)
    message = str(err.value)
    assert "generator.sampling.tempreature: unknown key" in message
    assert "max_new_tokens, stop, temperature, top_k, top_p" in message


def test_a_moved_setting_names_where_it_went(propel_registry):
    data = {"domain": {"name": "countdown"}, "train": {"lora_r": 8, "resume": False, "steps": 2}}
    with pytest.raises(ConfigError) as err:
        validate_config(data, propel_registry)
    assert "train.lora_r: this setting is lora.r now" in str(err.value)
    assert "train.resume: this setting is checkpoint.resume now" in str(err.value)
    moved = {"domain": {"name": "countdown"}, "lora": {"r": 8}, "checkpoint": {"resume": False}}
    assert validate_config(moved, propel_registry).lora.r == 8


def test_unknown_top_level_section(config_file, propel_registry):
    with pytest.raises(ConfigError, match=r"rewards: unknown key; valid keys here: .*reward"):
        load_config(config_file, ["rewards.rule=hard"], propel_registry)


def test_bad_value_names_key_and_value(config_file, propel_registry):
    with pytest.raises(ConfigError) as err:
        load_config(config_file, ["label.k=-2", "train.loss_type=ppo"], propel_registry)
    message = str(err.value)
    assert "label.k = -2: Input should be greater than 0" in message
    assert "train.loss_type = 'ppo'" in message and "'grpo', 'dr_grpo', 'dapo', 'bnpo', 'cispo' or 'sapo'" in message


def test_band_must_be_ordered(propel_registry):
    with pytest.raises(ConfigError, match=r"band_low .* must not exceed band_high"):
        validate_config(
            {"domain": {"name": "countdown"}, "label": {"band_low": 0.5, "band_high": 0.25}}, propel_registry
        )


def test_missing_domain(propel_registry):
    with pytest.raises(ConfigError, match="domain: required key is missing"):
        validate_config({}, propel_registry)


def test_unknown_pooler_in_list(propel_registry):
    with pytest.raises(ConfigError, match=r"probe\.poolings: unknown pooler 'mean_last'"):
        validate_config({"domain": {"name": "countdown"}, "probe": {"poolings": ["max", "mean_last"]}}, propel_registry)


def test_missing_file(propel_registry):
    with pytest.raises(
        ConfigError, match=r"config file nope\.yaml does not exist, nor is it a built-in config: demo, "
    ):
        load_config("nope.yaml", [], propel_registry)


def test_a_built_in_config_is_read_by_its_name_from_any_folder(propel_registry, tmp_path, monkeypatch):
    """``load_config("small/arithmetic")`` reads the shipped file, as ``propel run small/arithmetic``
    does, so a script outside the checkout names it as the command line would."""
    monkeypatch.chdir(tmp_path)
    config = load_config("small/arithmetic", ["generate.num_tasks=4"], propel_registry)
    assert (config.domain.name, config.run_dir.as_posix(), config.generate.num_tasks) == (
        "arithmetic",
        "runs/small-arithmetic",
        4,
    )


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [("layers", [3, 7, 3], "3"), ("architectures", ["mlp", "linear", "mlp"], "mlp"), ("seeds", [0, 0], "0")],
)
def test_a_sweep_axis_lists_each_value_once(propel_registry, field, value, named):
    """A repeated layer, architecture, ... would train the same cells twice and merge their results."""
    with pytest.raises(ConfigError, match=rf"probe.*{field} lists {named} more than once"):
        validate_config({"domain": {"name": "arithmetic"}, "probe": {field: value}}, propel_registry)


@pytest.mark.parametrize(
    ("label", "reachable"),
    [
        ({"k": 2}, False),  # 0, 0.5, 1: none in the default band 1/8..3/8
        ({"k": 1}, False),
        ({"k": 3}, True),  # 1/3
        ({"k": 8}, True),
        ({"k": 2, "band_low": 0.5, "band_high": 0.5}, True),
        ({"k": 4, "min_valid_attempts": 4, "band_low": 0.3, "band_high": 0.4}, False),  # 1/4, 2/4 straddle it
        ({"k": 4, "min_valid_attempts": 3, "band_low": 0.3, "band_high": 0.4}, True),  # 1/3 with a null attempt
    ],
)
def test_a_band_no_solve_rate_can_reach_is_named_when_the_config_is_read(propel_registry, caplog, label, reachable):
    config = validate_config({"domain": {"name": "countdown"}, "label": label}, propel_registry)
    assert config.label.reachable_in_band() is reachable
    assert ("no solve rate that k=" in caplog.text) is not reachable


def test_a_band_the_evaluations_k_cannot_reach_is_named_once_with_its_setting(propel_registry, caplog):
    """Labels at another K (evaluate.k, train.audit.k) are planned when the config is read: a band no
    solve rate at that K reaches is said once, naming the setting; at the label section's own K, or a
    K that reaches it, nothing is said of it."""
    data = {"domain": {"name": "countdown"}, "evaluate": {"k": 2}, "train": {"audit": {"every": 1, "k": 3}}}
    validate_config(data, propel_registry)
    assert caplog.text.count("no solve rate") == 1 and "evaluate.k: no solve rate that k=2" in caplog.text
    assert "raise evaluate.k" in caplog.text


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        (
            {"train": {"group_size": 3}},
            r"train.per_device_batch x train.gradient_accumulation \(64\) must be a multiple",
        ),
        (
            {"solve_train": {"replay": {"strategy": "top_k"}}},
            r"solve_train.replay works with solve_train.algorithm: grpo",
        ),
        (
            {"solve_train": {"baseline": "trained-tasks"}},
            r"solve_train.baseline names this run itself \('trained-tasks'\)",
        ),
        ({"evaluate": {"adapter": "best_audited"}}, r"evaluate.adapter: best_audited .* train.audit.every is 0"),
        ({"probe": {"layers": []}}, r"probe: layers lists nothing"),
        ({"seed": 2**32}, r"seed = 4294967296"),
    ],
)
def test_a_setting_a_stage_would_refuse_later_is_refused_when_the_config_is_read(propel_registry, settings, named):
    """Conflicts that depend on the config alone, refused in one line before any stage spends anything
    (each of these passed the read and failed a stage: after label, after training, or with a traceback)."""
    with pytest.raises(ConfigError, match=named) as caught:
        validate_config({"domain": {"name": "countdown"}, **settings}, propel_registry)
    assert "Traceback" not in str(caught.value) and len(str(caught.value).splitlines()) == 2
    fixed = {"train": {"group_size": 4}, "solve_train": {"replay": {"strategy": "top_k"}, "algorithm": "grpo"}}
    assert validate_config({"domain": {"name": "countdown"}, **fixed}, propel_registry)


def test_a_component_options_are_read_as_its_factory_reads_them(propel_registry):
    """Options are checked against the factory's own signature, nested ones too: a sandbox option
    inside a domain's options, a value of another type; a value pydantic reads is put back as read (a
    quoted "false" would be a true string)."""

    def problems(options):
        with pytest.raises(ConfigError) as caught:
            validate_config({"domain": {"name": "azr", "options": options}}, propel_registry)
        return str(caught.value)

    assert "domain 'azr' option 'sandbox_options': sandbox 'local' takes no option 'timeout'" in problems(
        {"sandbox_options": {"timeout": 5}}
    )
    assert "(did you mean 'time_limit'?)" not in problems({"sandbox_options": {"timeout": 5}})  # too far apart
    assert "unknown sandbox 'lcal'; installed: docker, local (did you mean 'local'?)" in problems({"sandbox": "lcal"})
    assert "sandbox 'local' option 'memory_mb' = 'lots': Input should be a valid integer" in problems(
        {"sandbox_options": {"memory_mb": "lots"}}
    )
    config = validate_config({"domain": {"name": "countdown", "options": {"direct_answer": "false"}}}, propel_registry)
    assert config.domain.options == {"direct_answer": False}
    assert propel_registry.domain("countdown", **config.domain.options).direct_answer is False


def test_a_factory_propel_cannot_call_is_named(propel_registry):
    """A sampler whose seed is positional-only, or a rule whose config is keyword-only, is named when
    the config is read, not when the stage calls it."""
    from propel_core.plugins import CALLS

    def sampler(contexts, seed, /, rate=0.5):
        raise AssertionError("never called")

    def rule(*, config, threshold=0.5):
        raise AssertionError("never called")

    propel_registry.components["context_samplers"]["odd"] = type(
        next(iter(propel_registry.components["context_samplers"].values()))
    )("context_samplers", "odd", sampler, "test")
    propel_registry.components["reward_rules"]["odd"] = type(
        next(iter(propel_registry.components["reward_rules"].values()))
    )("reward_rules", "odd", rule, "test")
    try:
        assert CALLS["context_samplers"] == (1, ("seed",))
        assert propel_registry.check_options("context_samplers", "odd", {}) == [
            "context sampler 'odd''s factory cannot be called as propel calls it, with 1 positional argument(s) "
            "and the keyword(s) seed; see docs/plugin_hooks.md"
        ]
        assert (
            "reward rule 'odd''s factory cannot be called"
            in propel_registry.check_options("reward_rules", "odd", {})[0]
        )
    finally:
        del propel_registry.components["context_samplers"]["odd"], propel_registry.components["reward_rules"]["odd"]


def test_only_a_scalar_is_put_back_as_read_and_a_plugins_mistakes_are_lines(propel_registry):
    """A container option reaches the factory as written (pydantic reads an Iterable as a one-shot
    iterator, a set in no fixed order); a component_options entry of a kind without options, or one
    that holds its own options, is a problem line, not an exception."""
    from collections.abc import Iterable

    from propel_core.plugins import Component

    def made(sizes: Iterable[int] = (), tags: set[str] = frozenset(), flag: bool = True, inner: str = "looped"):
        raise AssertionError("never called")

    def looped(inner: str = "looped", inner_options: dict | None = None):
        raise AssertionError("never called")

    looped.component_options = {"inner_options": ("domains", "inner")}
    made.component_options = {"tags": ("poolers", "inner")}
    propel_registry.components["domains"]["made"] = Component("domains", "made", made, "test")
    propel_registry.components["domains"]["looped"] = Component("domains", "looped", looped, "test")
    try:
        options = {"sizes": [1, 2, 3], "tags": ["b", "a"], "flag": "false"}
        problems = propel_registry.check_options("domains", "made", options)
        assert options == {"sizes": [1, 2, 3], "tags": ["b", "a"], "flag": False}
        assert problems == [
            "domain 'made' declares component_options 'tags' of kind 'poolers', which takes no options from the "
            "config; kinds that do: context_samplers, domains, executors, model_backends, reward_rules, sandboxes"
        ]
        assert propel_registry.check_options("domains", "looped", {"inner_options": {}}) == [
            "domain 'looped' option 'inner_options' names 'looped', whose options hold its own (a cycle)"
        ]
    finally:
        del propel_registry.components["domains"]["made"], propel_registry.components["domains"]["looped"]


@pytest.mark.parametrize(
    "key, url",
    [
        ("solver.base_url", "http://user:s3cret@127.0.0.1:9/v1"),
        ("generator.base_url", "https://s3cret@api.example.com/v1"),
        ("train.vllm_server_base_url", "http://127.0.0.1:8000/v1?api_key=s3cret"),
        ("solver.options.proxy", "http://host/v1?x=1&Access-Token=s3cret"),
        ("executor.options.address", "ray://admin:s3cret@head:10001"),
        ("solver.base_url", "https://acct.blob.core.windows.net/c?sv=2020-08-04&sig=s3cret"),
        ("solver.base_url", "https://host/v1#access_token=s3cret"),
        ("solver.base_url", "https://host/v1?a=1;to%6Ben=s3cret"),
        ("solver.base_url", "https://host/v1?apiKey=s3cret"),
        ("solver.options.command", "curl https://user:s3cret@host/v1"),
        ("solver.options.remote", "git+https://s3cret@github.com/org/repo"),
        ("solver.options.proxy", "user:s3cret@proxy.example.com:8080"),
        ("solver.base_url", "https://host/v1?apitoken=s3cret"),
        ("solver.base_url", "https://host/v1?clientSecret=s3cret"),
    ],
)
def test_a_url_with_a_credential_is_refused_and_never_repeated(key, url, tmp_path, propel_cli):
    """Configs are copied into the run folder, report.html and the console: a URL holding a secret
    is refused when the config is read, in one line that names the key and not the secret."""
    config = tmp_path / "run.yaml"
    config.write_text(f"run_dir: {tmp_path / 'run'}\ndomain: {{name: countdown}}\n")
    refused = propel_cli("label", str(config), f"{key}={url}", check=False)
    assert refused.returncode == 1 and f"{key} holds a URL with a credential" in refused.stderr
    assert "s3cret" not in refused.stderr + refused.stdout
    assert not [path for path in tmp_path.rglob("*") if path.is_file() and b"s3cret" in path.read_bytes()]


@pytest.mark.parametrize(
    "url",
    [
        "https://host/v1?monkey=1&keyword=cats&tokenizer=gpt2&max_tokens=64",
        "https://host/v1?language_code=en&token_count=5&cache_key=a&sort_key=b&session_len=30",
        "Contact //support@example.com please",
        "ssh://git@github.com/org/repo.git",
        "https://host/run/@cf/meta?email=a@b.c",
        "HEAD:6379",
    ],
)
def test_ordinary_urls_are_not_taken_for_credentials(url):
    from propel_core.config import url_credentials

    assert url_credentials({"solver": {"base_url": url}}) == []


def test_urls_without_credentials_are_kept(propel_registry):
    config = validate_config(
        {
            "domain": {"name": "countdown"},
            "solver": {"backend": "openai", "base_url": "http://127.0.0.1:8000/v1?api-version=2024-06-01"},
            "generator": {"base_url": "https://api.example.com/v1#frag@x"},
        },
        propel_registry,
    )
    assert config.solver.base_url.endswith("api-version=2024-06-01")


@pytest.mark.parametrize(
    "text",
    [
        b'run_dir: "/x/run-\\udcff"\ndomain: {name: countdown}\n',  # an escape YAML refuses
        b"domain: {name: countdown\nlabel: [\n",  # unclosed
        b"# caf\xe9\ndomain: {name: countdown}\n",  # Latin-1, not UTF-8
    ],
)
def test_a_config_no_parser_reads_is_one_line(text, tmp_path, propel_cli):
    config = tmp_path / "run.yaml"
    config.write_bytes(text)
    refused = propel_cli("label", str(config), check=False)
    assert refused.returncode == 1 and refused.stderr.startswith("Error: cannot read config:"), refused.stderr
    assert refused.stderr.count("\n") == 1


def test_a_local_model_path_that_is_not_there_is_refused_when_the_config_is_read(tmp_path, propel_registry):
    """A model named by a path must exist when the config is read (propel config says so before any
    stage starts or writes a file); a Hugging Face id (owner/name) and a path that is there pass."""
    missing = tmp_path / "no-such-model"
    with pytest.raises(ConfigError, match=rf"generator\.model = '{missing}': .*model {missing} does not exist"):
        validate_config({"domain": {"name": "countdown"}, "generator": {"model": str(missing)}}, propel_registry)
    with pytest.raises(ConfigError, match=r"solver\.model = './nowhere/model'"):
        validate_config({"domain": {"name": "countdown"}, "solver": {"model": "./nowhere/model"}}, propel_registry)
    (tmp_path / "here").mkdir()
    for model in ("Qwen/Qwen2.5-3B-Instruct", str(tmp_path / "here")):
        assert validate_config({"domain": {"name": "countdown"}, "generator": {"model": model}}, propel_registry)


def test_progress_names_the_backend_where_no_model_is_loaded():
    from propel_core.config import ModelConfig

    assert ModelConfig().shown == "SmolLM2-135M-Instruct"
    assert ModelConfig(backend="arithmetic_skill").shown == "arithmetic_skill backend"
