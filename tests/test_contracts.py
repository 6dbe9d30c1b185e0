"""Each component kind's typed contract (propel_core.contracts), checked by the registry's accessors:
the built-ins meet theirs, and a plugin that returns the wrong thing gets one line naming it."""

import pytest

from propel_core import hookimpl
from propel_core.config import RewardConfig
from propel_core.contracts import (
    PROBE_SCORES,
    ContextSampler,
    Executor,
    RepositorySandbox,
    RewardRule,
    Sandbox,
    reads_probe,
)
from propel_core.errors import PropelError
from propel_core.records import Context, JsonlWriter, Label, SolverAttempt, Task, Validity


def test_the_built_ins_meet_their_contracts(propel_registry, tmp_path):
    contexts = [Context(id=str(i), data={}, bucket=str(i % 2)) for i in range(4)]
    task = Task(id="t0", domain="d", context_id="0", generation="", text="1 + 1", validity=Validity.ok(), generator="m")
    attempt = SolverAttempt(text="2", solved=True)
    with JsonlWriter(tmp_path / "tasks.jsonl") as tasks, JsonlWriter(tmp_path / "labels.jsonl") as labels:
        tasks.write(task)
        labels.write(Label.from_attempts("t0", [attempt], (0.0, 0.5), 1))
    options = {"trace": {"trace": str(tmp_path / "labels.jsonl")}}  # the last round's labels
    for name in propel_registry.names("context_samplers"):
        sampler = propel_registry.context_sampler(name, contexts, 0, **options.get(name, {}))
        assert isinstance(sampler, ContextSampler)
    for name in propel_registry.names("reward_rules"):
        rule = propel_registry.reward_rule(name, RewardConfig())
        assert isinstance(rule, RewardRule) and rule.needs
    executor = propel_registry.executor("local", 2)
    assert isinstance(executor, Executor) and executor.in_flight == 0
    local = propel_registry.sandbox("local", allow_unisolated=True)
    assert isinstance(local, Sandbox) and isinstance(local, RepositorySandbox)


def test_a_rule_without_needs_reads_the_probe(propel_register_plugin):
    class Plugin:
        @staticmethod
        @hookimpl
        def register_reward_rules(register):
            register("plain", lambda config: lambda task, scores: scores["logit"])

    registry = propel_register_plugin(Plugin)
    rule = registry.reward_rule("plain", RewardConfig())
    assert rule.needs == PROBE_SCORES and reads_probe(rule)
    assert rule(None, {"logit": 1.5}) == 1.5


class NoUpdate:
    def __init__(self, contexts, seed):
        self.contexts = contexts

    def sample(self, n):
        return self.contexts[:n]


class NoRunPython:
    def __init__(self, **options):
        pass


class NotRunning:
    def __init__(self, workers):
        self.in_flight = 0


@pytest.mark.parametrize(
    ("hook", "kind", "build", "missing"),
    [
        ("register_context_samplers", "context sampler", lambda r: r.context_sampler("bad", [], 0), "ContextSampler"),
        ("register_sandboxes", "sandbox", lambda r: r.sandbox("bad"), "Sandbox"),
        ("register_sandboxes", "sandbox", lambda r: r.repository_sandbox("bad"), "RepositorySandbox"),
        ("register_executors", "executor", lambda r: r.executor("bad", 2), "Executor"),
        ("register_reward_rules", "reward rule", lambda r: r.reward_rule("bad", RewardConfig()), "a callable"),
    ],
)
def test_a_component_that_breaks_its_contract_is_named(propel_register_plugin, hook, kind, build, missing):
    made = {
        "register_context_samplers": NoUpdate,
        "register_sandboxes": NoRunPython,
        "register_executors": NotRunning,
        "register_reward_rules": lambda config: 0.5,  # a number, not a rule
    }[hook]

    class Broken:
        pass

    setattr(Broken, hook, staticmethod(hookimpl(lambda register: register("bad", made), specname=hook)))
    registry = propel_register_plugin(Broken)
    with pytest.raises(PropelError, match=rf"^{kind} 'bad' of plugin '.*' made a \w+, not .*{missing}") as raised:
        build(registry)
    assert "\n" not in str(raised.value)
