"""tests/example_sandbox_plugin, the tutorial's domain that runs the solver's code in the sandbox
(docs/writing_plugins.md, "A domain that runs code"): the tutorial's code is the packages' code, the
package pip-installs and passes its own tests, and hostile attempts are never graded solved."""

import builtins
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from propel_core.errors import Unavailable
from propel_core.plugins import Registry, get_plugin_manager

ROOT = Path(__file__).parent.parent
TUTORIAL = ROOT / "docs" / "writing_plugins.md"
PACKAGES = (ROOT / "tests" / "example_plugin", ROOT / "tests" / "example_sandbox_plugin")
SANDBOX_SECTION = "A domain that runs code"
TEST_SECTION = "Test it"
SOURCES = {".py", ".toml", ".yaml"}  # what the packages are written in (not their build outputs)


def section(title: str) -> str:
    """The text of the tutorial's numbered section ``title``, up to the next one."""
    match = re.search(rf"^## \d+\. {re.escape(title)}.*?(?=^## |\Z)", TUTORIAL.read_text(), re.S | re.M)
    assert match, f"docs/writing_plugins.md has no section '## N. {title}'"
    return match.group(0)


def code_blocks(text: str) -> list[tuple[str, str]]:
    """Every fenced block in ``text``: (its language, its code)."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)


def sandbox_works() -> bool:
    try:
        Registry.build().sandbox("local")
    except Unavailable:
        return False
    return True


def test_the_tutorials_code_is_the_example_packages_code():
    """Every block of the sandbox section and every Python block of the test section is text that
    appears, as written, in one file of the example packages, so the doc shows code that is tested."""
    files = [path.read_text() for package in PACKAGES for path in package.rglob("*") if path.suffix in SOURCES]
    blocks = code_blocks(section(SANDBOX_SECTION))
    blocks += [(language, code) for language, code in code_blocks(section(TEST_SECTION)) if language == "python"]
    assert sum(language == "python" for language, _ in blocks) >= 6
    missing = [code for _, code in blocks if not any(code in text for text in files)]
    assert not missing, "not in tests/example_plugin or tests/example_sandbox_plugin, as written:\n" + "\n---\n".join(
        missing
    )


def test_the_tutorials_sections_are_numbered_in_order():
    numbers = [int(n) for n in re.findall(r"^## (\d+)\. ", TUTORIAL.read_text(), re.M)]
    assert numbers == list(range(1, len(numbers) + 1))


def test_the_package_installs_and_passes_its_own_tests(example_sandbox_plugin_site):
    """The package, pip-installed, passes its own tests (its tests/ folder, run from the copy it was
    built from, importing the installed module, as its author would run them)."""
    site = example_sandbox_plugin_site
    source = site.with_name(f"{site.name}-source")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    for name in ("PYTEST_ADDOPTS", "PROPEL_LOAD_PLUGINS"):
        env.pop(name, None)
    command = [sys.executable, "-P", "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:xdist", "tests"]
    result = subprocess.run(command, cwd=source, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = result.stdout.strip().splitlines()[-1]
    if sandbox_works():  # where it does not, the grading tests skip, saying why
        assert re.fullmatch(r"\d+ passed in .*", summary), result.stdout[-3000:]
    where = [sys.executable, "-P", "-c", "import propel_int_function; print(propel_int_function.__file__)"]
    imported = subprocess.run(where, cwd=source, env=env, capture_output=True, text=True, check=True).stdout
    assert imported.startswith(str(site)), imported  # the installed module, not the source


TIME_LIMIT = 1.0
TASK = {"description": "f(n) returns n times n plus one", "examples": [[2, 5], [0, 1], [-3, 10], [10, 101]]}


@pytest.fixture
def registry(example_sandbox_plugin_site, monkeypatch):
    """A registry with the installed package in it, for this test only."""
    monkeypatch.syspath_prepend(str(example_sandbox_plugin_site))
    return Registry.build(get_plugin_manager())


def test_the_packages_config_reads_and_a_misspelt_sandbox_option_is_refused(registry):
    import yaml

    from propel_core.config import ConfigError
    from propel_core.plans import validate_config

    data = yaml.safe_load((PACKAGES[1] / "int_function.yaml").read_text())
    config = validate_config(data, registry)
    assert config.domain.name == "int_function" and config.domain.options["sandbox_options"]["memory_mb"] == 256
    data["domain"]["options"]["sandbox_options"] = {"time_limt": 1}
    with pytest.raises(ConfigError, match=r"sandbox 'local' takes no option 'time_limt'.*did you mean 'time_limit'"):
        validate_config(data, registry)


@pytest.fixture
def domain(registry):
    domain = registry.domain("int_function", time_limit=TIME_LIMIT)
    try:
        domain.sandbox  # noqa: B018
    except Unavailable as exc:
        pytest.skip(f"grading hostile code needs the local sandbox's every layer: {exc}")
    return domain


def python(code: str) -> str:
    return f"```python\n{code}```"


@pytest.fixture
def host(tmp_path):
    """A world-writable folder on the host holding a secret: the solver's code must neither read it
    nor write beside it."""
    os.chmod(tmp_path, 0o777)
    secret = tmp_path / "secret.txt"
    secret.write_text("propel-canary-42")
    os.chmod(secret, 0o666)
    return tmp_path


def test_code_that_reaches_outside_its_folder_gets_nowhere(domain, host):
    """It would be solved if it could read the host's file and write beside it; in the sandbox it sees
    neither, and it never runs in this process either."""
    code = (
        "import builtins\n"
        "builtins.propel_ran_in_the_harness = True\n"
        "def f(n):\n"
        f"    secret = open({str(host / 'secret.txt')!r}).read()\n"
        f"    open({str(host / 'written.txt')!r}, 'w').write(secret)\n"
        "    return n * n + 1\n"
    )
    verdict = domain.grade(TASK, python(code))
    assert verdict.solved is False
    assert re.fullmatch(
        r"4 of 4 examples wrong; first: f\(2\) raised (FileNotFoundError|PermissionError)", verdict.reason
    )
    assert sorted(path.name for path in host.iterdir()) == ["secret.txt"]
    assert (host / "secret.txt").read_text() == "propel-canary-42"
    assert not hasattr(builtins, "propel_ran_in_the_harness")


def test_code_that_loops_forever_times_out_and_is_not_solved(domain):
    from propel_core.testing import stray_sandbox_processes

    started = time.monotonic()
    verdict = domain.grade(TASK, python("def f(n):\n    while True:\n        pass\n"))
    assert time.monotonic() - started < TIME_LIMIT + 10
    assert verdict.solved is False and verdict.reason.startswith("timeout: ")
    assert not stray_sandbox_processes(range(200000, 200000 + 4096))  # the local sandbox's default uids


FORGERIES = {
    # prints what a careless grader might look for, and exits 0 before the driver writes a result
    "passed_marker_and_exit_0": (
        "import os\nprint('passed')\nprint('4 of 4 examples right')\nos._exit(0)\n",
        "no_result: the program exited without writing its result",
    ),
    # writes a result saying it passed, then exits 0
    "result_file_saying_passed": (
        "import json, os\njson.dump({'passed': True, 'solved': True}, open('result.json', 'w'))\nos._exit(0)\n",
        "malformed result",
    ),
    # writes a well-formed result: the shown examples' outputs it knows, and guesses for the others
    "result_file_with_outputs": (
        "import json, os\noutputs = [{'value': v} for v in (5, 1, 0, 0)]\n"
        "json.dump({'outputs': outputs}, open('result.json', 'w'))\nos._exit(0)\n",
        "2 of 4 examples wrong; first: f(-3) = 0, expected 10",
    ),
    # an exit code the local sandbox reads as the CPU limit's signal: still the attempt's own doing
    "exit_code_that_reads_as_a_timeout": ("import sys\nsys.exit(152)\n", "timeout: CPU time limit"),
}


@pytest.mark.parametrize("name", FORGERIES)
def test_a_forged_success_is_not_solved(domain, name):
    code, reason = FORGERIES[name]
    verdict = domain.grade(TASK, python(code))
    assert (verdict.solved, verdict.reason) == (False, reason)
