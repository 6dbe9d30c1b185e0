"""``Domain.sandbox``: the one way a domain owns the sandbox its options name. Made on first use under
a lock, so threads that ask at once share one sandbox; without a registry, one line says how to make
the domain instead."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from test_hooks import Tiny

from propel_core import PropelError, hookimpl


class Slow:
    """A sandbox that takes a while to make and counts how many were made."""

    made = 0

    def __init__(self, **options):
        time.sleep(0.05)  # long enough for every thread to ask before the first one is made
        Slow.made += 1
        self.options = options

    def run_python(self, files, main, hash_seed=0, time_limit=None):
        raise AssertionError("not run here")

    def workspace(self, path=None, image=None, workdir="/testbed"):
        raise AssertionError("not run here")


class ProgramsOnly:
    def run_python(self, files, main, hash_seed=0, time_limit=None):
        raise AssertionError("not run here")


class Runner(Tiny):
    def __init__(self, sandbox="slow", sandbox_options=None):
        self.sandbox_name, self.sandbox_options = sandbox, dict(sandbox_options or {})


class RepositoryRunner(Runner):
    sandbox_runs = "repositories"


class Plugin:
    @staticmethod
    @hookimpl
    def register_domains(register):
        register("runner", Runner)
        register("repository_runner", RepositoryRunner)

    @staticmethod
    @hookimpl
    def register_sandboxes(register):
        register("slow", Slow)
        register("programs_only", ProgramsOnly)


@pytest.mark.parametrize("name", ["runner", "repository_runner"])
def test_threads_that_ask_at_once_get_one_sandbox(propel_register_plugin, name):
    domain = propel_register_plugin(Plugin).domain(name, sandbox_options={"memory_mb": 64})
    Slow.made = 0
    start = threading.Barrier(16)

    def ask(_):
        start.wait()
        return domain.sandbox

    with ThreadPoolExecutor(16) as pool:
        sandboxes = list(pool.map(ask, range(16)))
    assert Slow.made == 1 and all(sandbox is sandboxes[0] for sandbox in sandboxes)
    assert sandboxes[0].options == {"memory_mb": 64} and domain.sandbox is sandboxes[0]


def test_a_domain_gets_a_sandbox_that_runs_what_it_says(propel_register_plugin):
    registry = propel_register_plugin(Plugin)
    assert isinstance(registry.domain("runner", sandbox="programs_only").sandbox, ProgramsOnly)
    with pytest.raises(PropelError, match="made a ProgramsOnly, not a RepositorySandbox"):
        registry.domain("repository_runner", sandbox="programs_only").sandbox  # noqa: B018


def test_a_domain_without_a_registry_says_how_to_make_it():
    with pytest.raises(PropelError) as caught:
        Runner().sandbox  # noqa: B018
    assert str(caught.value) == (
        "domain Runner has no registry to make its sandbox from: make the domain with Registry.domain(name, **options)"
    )


def test_what_a_sandbox_runs_is_one_of_two():
    with pytest.raises(TypeError, match=r"^Bad.sandbox_runs is 'repos'; choose one of: programs, repositories$"):

        class Bad(Runner):
            sandbox_runs = "repos"
