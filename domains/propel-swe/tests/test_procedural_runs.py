"""The procedural generator in runs on the tiny repository, in the real local sandbox: every episode
of a repository gets its own mutant whatever the order or the executor, only code the suite imports
is mutated, no generator model is loaded, and a bug that hangs the suite costs little."""

import json
import shutil
from pathlib import Path

import pytest
from conftest import DATA, SANDBOX, local_domain, needs_local_sandbox
from swe_helpers import write_registry

from propel_core.domain import ParseError
from propel_core.errors import PropelError
from propel_core.plans import validate_config
from propel_core.plugins import Registry
from propel_core.run import Run
from propel_core.stages.generate import generate
from propel_core.stages.train import train
from propel_swe.checkout import git_checkout

MUTANTS = 13  # the tiny repository's distinct mutants (all in tinystats/core.py)
NOT_CODE = "def shift(x):\n    if x > 0:\n        return x + 1\n    return False\n"  # mutation sites, tested by nothing


def procedural(repo, test_env, folder, imported=None):
    folder.mkdir(exist_ok=True)
    domain = local_domain("tinystats", repo, test_env, folder, generator="procedural")
    if imported is not None:  # what an older preflight recorded the suite imported, set by hand (no lines run)
        baseline = domain.baseline(domain.repos["tinystats"])
        baseline.imported_files, baseline.lines_run = imported, None
    return domain


def diffs(domain, contexts):
    payloads = [domain.parse(domain.episode(context, None, seed=0)) for context in contexts]
    return [payload["diff"] for payload in payloads]


def test_n_episodes_give_n_distinct_bugs_in_any_order(tiny_repo, test_env, tmp_path):
    domain = procedural(tiny_repo, test_env, tmp_path / "a")
    contexts = domain.episode_contexts(domain.contexts() * (MUTANTS + 1), seed=5)
    assert [context.data["mutant"] for context in contexts] == list(range(MUTANTS + 1))
    forward = diffs(domain, contexts[:MUTANTS])
    assert len(set(forward)) == MUTANTS and all(diff.startswith("--- a/tinystats/core.py") for diff in forward)
    with pytest.raises(ParseError, match=f"no mutant left: tinystats has {MUTANTS} distinct mutants"):
        domain.parse(domain.episode(contexts[MUTANTS], None, seed=0))
    fresh = procedural(tiny_repo, test_env, tmp_path / "b")  # another worker, asked in the other order
    assert diffs(fresh, contexts[:MUTANTS][::-1])[::-1] == forward
    other_run = diffs(fresh, fresh.episode_contexts(fresh.contexts() * MUTANTS, seed=6))
    assert other_run != forward and set(other_run) == set(forward)  # another run seed: another order


def test_bugs_only_in_code_the_suite_imports(test_env, tmp_path):
    repo = Path(shutil.copytree(DATA / "tinystats", tmp_path / "tinystats"))
    for path in ("docs/conf.py", "examples/demo.py", "versioneer.py", "setup.py", "tinystats/unused.py"):
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(NOT_CODE)
    repo = git_checkout(repo)

    def edited(domain):
        """The files that all the repository's mutants edit."""
        paths = set()
        for context in domain.episode_contexts(domain.contexts() * 100, seed=0):
            try:
                paths.add(domain.topic(domain.parse(domain.episode(context, None, seed=0))).split(":", 1)[1])
            except ParseError:  # no mutant left
                return paths
        raise AssertionError("more mutants than expected")

    preflight = procedural(repo, test_env, tmp_path / "preflight")
    imported = preflight.baseline(preflight.repos["tinystats"]).imported_files
    if imported:  # preflight records what the suite imported: nothing else is mutated
        assert "tinystats/unused.py" not in imported and edited(preflight) == {"tinystats/core.py"}
    assert edited(procedural(repo, test_env, tmp_path / "preflight", ["tinystats/core.py"])) == {"tinystats/core.py"}
    # an older preflight without the list: everything but documentation, examples and packaging
    assert edited(procedural(repo, test_env, tmp_path / "preflight", [])) == {
        "tinystats/core.py",
        "tinystats/unused.py",
    }


def test_generate_loads_no_generator_model_and_any_executor_gives_the_same_bugs(
    tiny_repo, test_env, tmp_path, monkeypatch
):
    needs_local_sandbox()
    registry = write_registry(tmp_path, [{"name": "tinystats", "path": str(tiny_repo), "time_budget": 60}])
    options = {
        "registry": str(registry),
        "preflight_dir": str(tmp_path / "preflight"),
        "generator": "procedural",
        "sandbox_options": {**SANDBOX, "python_env": str(test_env)},
    }

    def built(*args, **kwargs):
        raise AssertionError("a model backend was built")

    monkeypatch.setattr(Registry, "backend", built)

    def run(name: str, workers: int) -> Run:
        config = validate_config(
            {
                "run_dir": str(tmp_path / name),
                "seed": 3,
                "domain": {"name": "swe", "options": options},
                "generate": {"num_tasks": 6},
                "executor": {"name": "local", "workers": workers},
                "generator": {"model": "nobody/no-such-model"},  # never loaded, so never fetched
            }
        )
        return Run(config, Registry.build(), quiet=True)

    tasks = {}
    for name, workers in (("one", 1), ("three", 3)):
        generate(run(name, workers))
        lines = (tmp_path / name / "tasks.jsonl").read_text().splitlines()
        tasks[name] = {task["id"]: task["payload"]["diff"] for task in map(json.loads, lines)}
    assert len(tasks["one"]) == 6 and len(set(tasks["one"].values())) == 6
    assert tasks["three"] == tasks["one"]
    with pytest.raises(PropelError, match="no generator model to train"):
        train(run("one", 1))


#: a hang in C, which checks for no signal: each test's own time limit cannot stop it (a loop in Python it
#: can: test_second_runner), so the suite runs into its own limit
HANG = """\
--- a/tinystats/core.py
+++ b/tinystats/core.py
@@ -1,3 +1,5 @@
 def mean(values):
+    import itertools
+    sum(itertools.repeat(1))
     if not values:
         raise ValueError("mean of no values")
"""


def test_a_bug_that_hangs_the_suite_ends_well_under_the_time_budget(tiny_repo, test_env, tmp_path):
    """Depends on the verifier deriving the suite's time limit for a bug from the preflight duration
    (the tiny suite runs in well under a second: the least limit, 30 s), not on the repository's
    whole ``time_budget`` (120 s). The limit is CPU and own time, so it is read from the reason, not
    from the wall clock, which a busy machine stretches."""
    needs_local_sandbox()
    registry = write_registry(tmp_path, [{"name": "tinystats", "path": str(tiny_repo), "time_budget": 120}])
    domain = Registry.build().domain(
        "swe",
        registry=str(registry),
        preflight_dir=str(tmp_path / "preflight"),
        sandbox_options={**SANDBOX, "python_env": str(test_env)},
    )
    assert domain.baseline(domain.repos["tinystats"]).duration < 10
    validity = domain.verify({"repo": "tinystats", "diff": HANG, "turns": ["x"]})
    assert not validity.valid and "(timeout): over its time limit of 30 s" in validity.reason, validity.reason
