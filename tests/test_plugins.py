"""The plugin manager and registry: built-ins, entry points, duplicates, unknown names, filtering."""

import pytest

from propel_core import hookimpl
from propel_core.plugins import (
    DEFAULT_PLUGINS,
    KINDS,
    DuplicateComponent,
    Registry,
    UnknownComponent,
    get_plugin_manager,
)

REWARD_RULES = ["adversarial", "hard", "partial_instrumentation", "probe_only", "soft", "solver_in_the_loop", "wco"]


def test_builtins_are_ordinary_plugins(propel_plugin_manager):
    names = {name for name, _ in propel_plugin_manager.list_name_plugin()}
    assert set(DEFAULT_PLUGINS) <= names


def test_builtins_register_by_kind(propel_registry):
    assert propel_registry.names("model_backends") == ["arithmetic_skill", "openai", "transformers", "vllm"]
    assert propel_registry.names("reward_rules") == REWARD_RULES
    assert "mean_last_50" in propel_registry.names("poolers")
    assert propel_registry.names("probe_architectures") == ["deep_mlp", "linear", "logistic", "mlp"]
    assert propel_registry.names("context_samplers") == ["progress", "trace", "uniform"]


def test_every_kind_has_a_hook():
    from propel_core import hookspecs

    hooks = {n for n in dir(hookspecs) if n.startswith("register_")}
    assert {hook for hook, _ in KINDS.values()} == hooks - {"register_commands"}  # commands are not components


def test_registry_remembers_the_plugin(propel_registry):
    assert propel_registry.components["reward_rules"]["hard"].plugin == "propel_plugins.rewards"


class ClashingRewards:
    @staticmethod
    @hookimpl
    def register_reward_rules(register):
        register("hard", lambda config: None)


def test_duplicate_name_names_both_plugins(propel_register_plugin):
    with pytest.raises(DuplicateComponent) as err:
        propel_register_plugin(ClashingRewards, name="clashing-plugin")
    assert "'propel_plugins.rewards'" in str(err.value)
    assert "'clashing-plugin'" in str(err.value)
    assert "reward rule 'hard'" in str(err.value)


def test_unknown_name_lists_installed(propel_registry):
    with pytest.raises(UnknownComponent) as err:
        propel_registry.get("reward_rules", "wc0")
    message = str(err.value)
    assert message.startswith(
        "unknown reward rule 'wc0'; installed: adversarial, hard, partial_instrumentation, probe_only, soft, solver_in_the_loop, wco"
    )
    assert "did you mean 'wco'" in message


def test_describe_groups_by_plugin(propel_registry):
    described = {entry["name"]: entry for entry in propel_registry.describe()}
    rewards = described["propel_plugins.rewards"]
    assert rewards["registers"] == {"reward_rules": REWARD_RULES}
    assert rewards["version"] == described["propel_plugins.backends"]["version"] is not None


def test_load_plugins_env_restricts_entry_points(monkeypatch):
    monkeypatch.setenv("PROPEL_LOAD_PLUGINS", "")
    assert "countdown" not in Registry.build(get_plugin_manager()).names("domains")
    monkeypatch.setenv("PROPEL_LOAD_PLUGINS", "countdown")
    assert Registry.build(get_plugin_manager()).names("domains") == ["countdown"]


def test_fresh_managers_share_nothing(propel_register_plugin, propel_plugin_manager):
    class Extra:
        @staticmethod
        @hookimpl
        def register_context_samplers(register):
            register("always_first", lambda contexts, seed: None)

    assert "always_first" in propel_register_plugin(Extra).names("context_samplers")
    assert "always_first" not in Registry.build(get_plugin_manager()).names("context_samplers")
