"""`propel check`: a domain's parts on an author's samples, one line per problem, no model loaded."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from propel_core.checks import check_domain, read_samples
from propel_core.domain import ParseError, Verdict
from propel_core.errors import PropelError


def write(path, *samples):
    path.write_text("".join(json.dumps(sample) + "\n" for sample in samples))
    return path


def test_check_says_what_the_domain_made_of_each_sample_and_every_mismatch(propel_cli, tmp_path):
    (tmp_path / "c.yaml").write_text("domain: {name: arithmetic}\n")
    samples = write(
        tmp_path / "s.jsonl",
        {"generation": "Compute: 3 + 4", "attempts": ["7", "8"], "valid": True, "solved": [True, True]},
        {"generation": "Compute: hello", "valid": False},
        {"generation": "Compute: 2 + 2", "valid": False},
    )
    result = propel_cli("check", str(tmp_path / "c.yaml"), "--samples", str(samples), check=False)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0] == "sample 1: valid, topic 'addition'; attempt 1: solved; attempt 2: not solved"
    assert lines[1].startswith("sample 2: invalid (arithmetic_well_formed: ")
    problems = [line for line in lines if line.startswith("problem: ")]
    assert problems == [
        "problem: sample 1 attempt 2: expected solved, got not solved (answered 8, the value is 7)",
        "problem: sample 3: expected invalid, got valid",
    ]
    assert lines[-1] == "arithmetic: 2 problem(s) in 3 sample(s)"
    fixed = write(tmp_path / "ok.jsonl", {"generation": "Compute: 3 + 4", "attempts": ["7"], "solved": [True]})
    assert propel_cli("check", str(tmp_path / "c.yaml"), "--samples", str(fixed)).stdout.endswith(
        "0 problem(s) in 1 sample(s)\n"
    )


class Careless:
    """A domain whose parts fail in the ways `propel check` is for: a parser that raises a plain error,
    a solver prompt that is not messages, and a grader that keeps the attempt it grades on itself (two
    threads grade each other's attempts)."""

    name, validity_predicates, registry = "careless", (), None

    def contexts(self):
        from propel_core.records import Context

        return [Context(id="a", data={}), Context(id="a", data={})]

    def generator_prompt(self, context):
        return [{"role": "user", "content": "write a number"}]

    def parse(self, generation):
        if not generation.strip():
            raise ParseError("empty")
        return {"n": int(generation)}  # ValueError on words: a crash, not a reason

    def render(self, payload):
        return f"Say {payload['n']}"

    def topic(self, payload):
        return "numbers"

    def solver_prompt(self, payload):
        return "Say it"

    def grade(self, payload, attempt):
        self.attempt = attempt
        time.sleep(0.002 * (threading.get_ident() % 5))
        return Verdict(self.attempt.strip() == str(payload["n"]), None)


def test_check_finds_a_crashing_parser_a_wrong_prompt_repeated_ids_and_a_grader_that_shares_state():
    samples = [{"generation": str(n), "attempts": [str(n), str(n + 1)]} for n in range(6)] + [{"generation": "seven"}]
    shown: list[str] = []
    problems = check_domain(Careless(), {}, samples, shown.append)
    assert len(shown) == 7 and shown[0] == "sample 1: valid, topic 'numbers'; attempt 1: solved; attempt 2: not solved"
    assert "contexts(): context ids repeat; each must be unique" in problems
    assert "sample 1: solver_prompt: returned str, not a non-empty list of messages" in problems
    assert any(p.startswith("sample 7: parse failed: ValueError") for p in problems)
    assert any("grade must share no state between calls" in p for p in problems)
    assert all("\n" not in p for p in problems)


class Exits(Careless):
    """A domain whose grader ends the process, as an attempt's own code run in-process would, and
    whose contexts fail: the check says so instead of ending in silence."""

    def contexts(self):
        raise RuntimeError("no contexts today")

    def grade(self, payload, attempt):
        raise SystemExit(0)


def test_a_part_that_exits_or_raises_is_a_problem_not_the_end_of_the_check():
    problems = check_domain(Exits(), {}, [{"generation": "3", "attempts": ["3"]}], lambda line: None)
    assert "contexts(): raised RuntimeError: no contexts today" in problems
    assert "sample 1 attempt 1: grade raised SystemExit: 0" in problems


def test_samples_that_are_not_samples_are_one_line_each(tmp_path):
    import pytest

    for text, message in [
        ("{not json\n", "line 1 is not JSON"),
        ('{"attempts": []}\n', 'a sample is an object with a "generation" string'),
        ('{"generation": "x", "attempts": ["a"], "solved": [true, false]}\n', '"solved" has one true, false or null'),
        ("\n", "holds no sample"),
        ('{"generation": "x", "attempts": ["a"], "solved": ["yes"]}\n', '"solved" has one true, false or null'),
        ('{"generation": "x", "valid": "yes"}\n', '"valid" is true or false'),
    ]:
        (tmp_path / "s.jsonl").write_text(text)
        with pytest.raises(PropelError, match=message):
            read_samples(tmp_path / "s.jsonl")
    (tmp_path / "s.jsonl").write_bytes(b'{"generation": "\xff"}\n')
    with pytest.raises(PropelError, match="is not UTF-8 text"):
        read_samples(tmp_path / "s.jsonl")


def test_a_new_plugin_of_every_kind_installs_and_passes_its_own_tests(propel_cli, tmp_path, pip_install_into):
    """`propel new-plugin` writes a package whose tests pass once it is installed (its domain's through
    `propel check` too), that ruff finds clean, and that `propel plugins` lists with what it registers."""
    import os
    import subprocess
    import sys

    folder = tmp_path / "propel-tally"
    kinds = ("--kind", "domain", "--kind", "reward_rule", "--kind", "probe_head")
    written = propel_cli("new-plugin", str(folder), "--name", "tally", *kinds).stdout
    assert f"wrote {folder / 'propel_tally' / '__init__.py'}" in written
    ruff = [str(Path(sys.executable).with_name("ruff")), "--no-cache"]
    subprocess.run([*ruff[:1], "check", *ruff[1:], "."], cwd=folder, check=True)
    subprocess.run([*ruff[:1], "format", "--check", *ruff[1:], "."], cwd=folder, check=True)
    pip_install_into(folder, tmp_path / "site")
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])}
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", str(folder / "tests")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert tests.returncode == 0 and "4 passed" in tests.stdout, tests.stdout[-2000:]
    listed = subprocess.run(
        [str(Path(sys.executable).with_name("propel")), "plugins", "--json"], env=env, capture_output=True, text=True
    )
    plugin = {p["name"]: p for p in json.loads(listed.stdout)["plugins"]}["tally"]
    assert plugin["version"] == "0.1.0" and plugin["registers"] == {
        "domains": ["tally"],
        "validity_predicates": ["tally_in_range"],
        "reward_rules": ["tally_reward"],
        "probe_architectures": ["tally_head"],
    }
    refused = propel_cli("new-plugin", str(folder), "--name", "tally", check=False)
    assert refused.returncode == 1 and f"{folder} is not empty: name a new folder" in refused.stderr
    for name, why in [("core", "a module propel_core is already installed here"), ("x_", "words joined by single _")]:
        refused = propel_cli("new-plugin", str(tmp_path / name), "--name", name, check=False)
        assert refused.returncode == 1 and why in refused.stderr and not (tmp_path / name).exists()
