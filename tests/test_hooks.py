"""One test per hook in propel_core/hookspecs.py: a tiny plugin registers a component through the
hook, and the core finds it by name and uses it. ``test_docs.py`` checks that each hook has one."""

import math

import click
import pytest
from click.testing import CliRunner

from propel_core import hookimpl
from propel_core.cli import PropelGroup, add_plugin_commands
from propel_core.config import RewardConfig, Sampling
from propel_core.domain import Domain, ParseError, Verdict, make_task
from propel_core.errors import PropelError
from propel_core.plans import validate_config
from propel_core.plugins import Registry, get_plugin_manager
from propel_core.records import Context, Validity


class Tiny(Domain):
    validity_predicates = ("even_length",)

    def contexts(self):
        return [Context(id="c0", data={})]

    def generator_prompt(self, context):
        return [{"role": "user", "content": "Say something."}]

    def parse(self, generation):
        if not generation:
            raise ParseError("empty")
        return {"text": generation}

    def render(self, payload):
        return payload["text"]

    def solver_prompt(self, payload):
        return [{"role": "user", "content": payload["text"]}]

    def grade(self, payload, attempt):
        return Verdict(attempt == payload["text"])


class TinyPlugin:
    @staticmethod
    @hookimpl
    def register_domains(register):
        register("tiny", Tiny)

    @staticmethod
    @hookimpl
    def register_validity_predicates(register):
        register("even_length", lambda task, domain: Validity(valid=len(task.payload["text"]) % 2 == 0, reason="odd"))


def test_register_domains(propel_register_plugin):
    registry = propel_register_plugin(TinyPlugin)
    config = validate_config({"domain": {"name": "tiny"}}, registry)
    domain = registry.get("domains", config.domain.name)()
    assert domain.grade({"text": "ab"}, "ab").solved is True


def test_a_factory_error_is_one_line_but_a_full_disk_stays_itself(propel_register_plugin):
    """What a domain's constructor raises on its options is one line naming it; an empty stop string
    (which would end every generation at once) is refused; a full disk is left to the command line's
    own advice."""
    import errno

    def full(**options):
        raise OSError(errno.ENOSPC, "No space left on device")

    class Plugin:
        @staticmethod
        @hookimpl
        def register_domains(register):
            register("picky", lambda size=1: Tiny() if size > 0 else int("size"))
            register("stops_at_nothing", type("StopsAtNothing", (Tiny,), {"stop_strings": ("",)}))
            register("on_a_full_disk", full)

    registry = propel_register_plugin(Plugin)
    with pytest.raises(PropelError, match=r"^domain 'picky' of plugin '.*' could not be made \(options: size=0\): "):
        registry.domain("picky", size=0)
    with pytest.raises(PropelError, match=r"stop_strings must be a tuple of non-empty strings, got \(''"):
        registry.domain("stops_at_nothing")
    with pytest.raises(OSError, match="No space left"):
        registry.domain("on_a_full_disk")


def test_register_validity_predicates(propel_register_plugin):
    registry = propel_register_plugin(TinyPlugin)
    domain = registry.get("domains", "tiny")()
    predicates = {"even_length": registry.get("validity_predicates", "even_length")}
    context = domain.contexts()[0]
    assert make_task("a", domain, context, "ab", "m", predicates).validity.valid
    odd = make_task("b", domain, context, "abc", "m", predicates)
    assert odd.validity == Validity(valid=False, reason="even_length: odd")
    assert make_task("c", domain, context, "", "m", predicates).validity.reason == "parse: empty"


def test_register_model_backends(propel_register_plugin):
    class EchoBackend:
        model_id = "echo"

        def __init__(self, model):
            self.model = model

        def generate(self, prompts, sampling, n=1, seed=None):
            return [[str(p)] * n for p in prompts]

    class Plugin:
        @staticmethod
        @hookimpl
        def register_model_backends(register):
            register("echo", EchoBackend)

    registry = propel_register_plugin(Plugin)
    config = validate_config({"domain": {"name": "countdown"}, "solver": {"backend": "echo"}}, registry)
    backend = registry.backend(config.solver)
    assert backend.generate(["hi"], config.solver.sampling, n=2) == [["hi", "hi"]]
    # one instance per model, whatever the sampling; another model gets its own
    assert registry.backend(config.solver.model_copy(update={"sampling": Sampling(temperature=0)})) is backend
    assert registry.backend(config.solver.model_copy(update={"model": "other"})) is not backend


def test_register_poolers(propel_register_plugin):
    import torch

    class Plugin:
        @staticmethod
        @hookimpl
        def register_poolers(register):
            register("sum", lambda hidden, mask: (hidden * mask.unsqueeze(-1)).sum(1))

    registry = propel_register_plugin(Plugin)
    validate_config({"domain": {"name": "countdown"}, "probe": {"poolings": ["sum"]}}, registry)
    hidden, mask = torch.ones(1, 3, 2), torch.tensor([[1, 1, 0]])
    assert registry.get("poolers", "sum")(hidden, mask).tolist() == [[2.0, 2.0]]


def test_register_probe_architectures(propel_register_plugin):
    import torch

    class Plugin:
        @staticmethod
        @hookimpl
        def register_probe_architectures(register):
            register("norm", lambda input_dim: torch.nn.Sequential(torch.nn.Linear(input_dim, 1), torch.nn.Flatten(0)))

    registry = propel_register_plugin(Plugin)
    validate_config({"domain": {"name": "countdown"}, "probe": {"architectures": ["norm"]}}, registry)
    assert registry.get("probe_architectures", "norm")(7)(torch.zeros(5, 7)).shape == (5,)


def test_register_reward_rules(propel_register_plugin):
    class Plugin:
        @staticmethod
        @hookimpl
        def register_reward_rules(register):
            register("constant", lambda config: lambda task, scores: config.r_bad * 2)

    registry = propel_register_plugin(Plugin)
    config = validate_config({"domain": {"name": "countdown"}, "reward": {"rule": "constant"}}, registry)
    rule = registry.get("reward_rules", config.reward.rule)(config.reward.settled(False, None))  # as training builds it
    assert math.isclose(rule(None, {}), -0.4)
    assert registry.get("reward_rules", "hard")(RewardConfig())  # built-ins stay available


def test_register_context_samplers(propel_register_plugin):
    class FirstOnly:
        def __init__(self, contexts, seed, repeat=1):
            self.contexts, self.repeat = contexts, repeat

        def sample(self, n):
            return [self.contexts[0]] * n

        def update(self, contexts, rewards):
            pass

    class Plugin:
        @staticmethod
        @hookimpl
        def register_context_samplers(register):
            register("first_only", FirstOnly)

    registry = propel_register_plugin(Plugin)
    config = validate_config(
        {
            "domain": {"name": "countdown"},
            "generate": {"context_sampler": "first_only", "sampler_options": {"repeat": 2}},
        },
        registry,
    )
    contexts = [Context(id="a", data={}), Context(id="b", data={})]
    sampler = registry.get("context_samplers", config.generate.context_sampler)(
        contexts, seed=0, **config.generate.sampler_options
    )
    assert [c.id for c in sampler.sample(3)] == ["a", "a", "a"]


def test_register_sandboxes(propel_register_plugin):
    class InProcess:
        def __init__(self, **options):
            self.options = options

        def run(self, value):
            return {"status": "ok", "output": value}

    class Plugin:
        @staticmethod
        @hookimpl
        def register_sandboxes(register):
            register("in_process", InProcess)

    registry = propel_register_plugin(Plugin)
    sandbox = registry.get("sandboxes", "in_process")(memory_mb=64)
    assert sandbox.run(3) == {"status": "ok", "output": 3}
    with pytest.raises(Exception, match=r"unknown sandbox 'firecracker'; installed: .*in_process"):
        registry.get("sandboxes", "firecracker")


def test_register_executors(propel_register_plugin, tmp_path):
    """A third-party executor, chosen by name in config, runs the jobs of a real stage (generate)."""
    from propel_core.execution import sample_tasks
    from propel_core.run import Run

    class InOrder:
        """Runs jobs one after another, in order, and remembers them."""

        def __init__(self, workers, note=""):
            self.workers, self.note, self.in_flight, self.seen = workers, note, 0, []

        def run(self, worker, jobs):
            for job in jobs:
                self.seen.append(job.task_id)
                yield job, worker.run(job, generate=lambda prompts, sampling, n, seed: [["ab"] for _ in prompts])

    class Plugin:
        @staticmethod
        @hookimpl
        def register_executors(register):
            register("in_order", InOrder)

    propel_register_plugin(TinyPlugin)
    registry = propel_register_plugin(Plugin)
    config = validate_config(
        {
            "run_dir": str(tmp_path),
            "domain": {"name": "tiny"},
            "executor": {"name": "in_order", "workers": 2, "options": {"note": "x"}},
        },
        registry,
    )
    run = Run(config, registry, quiet=True)
    contexts = registry.domain("tiny").contexts() * 3
    tasks = sample_tasks(run.services, config.generator, contexts, tmp_path / "tasks.jsonl", config.seed)
    assert run.executor().seen == ["t000000", "t000001", "t000002"] and run.executor().note == "x"
    assert [task.generation for task in tasks] == ["ab"] * 3 and all(task.validity.valid for task in tasks)
    with pytest.raises(PropelError, match=r"executor.name: unknown executor 'slurm'; installed: .*in_order"):
        validate_config({"domain": {"name": "tiny"}, "executor": {"name": "slurm"}}, registry)


def test_register_commands():
    class Plugin:
        @staticmethod
        @hookimpl
        def register_commands(cli):
            @cli.command()
            @click.argument("name")
            def hello(name):
                """Greet NAME; an empty name is bad input."""
                if not name:
                    raise PropelError("hello needs a name")
                click.echo(f"hello {name}")

    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(Plugin)

    @click.group(cls=PropelGroup)
    def group():
        pass

    add_plugin_commands(pm, group)
    runner = CliRunner()
    assert runner.invoke(group, ["hello", "propel"]).output == "hello propel\n"
    failed = runner.invoke(group, ["hello", ""])
    assert failed.exit_code == 1 and "Error: hello needs a name" in failed.output


def test_a_register_commands_that_raises_leaves_its_plugin_out():
    """The command line calls each implementation itself (hookspecs.py): one that raises leaves its
    plugin out, components included, and listed as broken; the others' commands are there."""

    class Broken:
        @staticmethod
        @hookimpl
        def register_commands(cli):
            raise RuntimeError("needs click 99")

        @staticmethod
        @hookimpl
        def register_domains(register):
            register("broken_tiny", Tiny)

    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(Broken, name="broken")
    pm.register(TinyPlugin, name="tiny")

    @click.group(cls=PropelGroup)
    def group():
        pass

    add_plugin_commands(pm, group)
    assert [(plugin.name, plugin.error) for plugin in pm.broken] == [("broken", "RuntimeError: needs click 99")]
    assert "broken_tiny" not in Registry.build(pm).names("domains")


def test_plugin_commands_reach_the_propel_cli():
    from propel_core.cli import cli

    assert "swe" in cli.commands  # the SWE domain package adds `propel swe ...`
