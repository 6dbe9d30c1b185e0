"""``propel new-plugin``: a plugin package to start from, with a domain, a reward rule or a probe head
(any of them) and tests that pass once it is installed.

The package is named ``propel-NAME`` (module ``propel_NAME``, entry point ``NAME``), and every
component it registers starts with ``NAME`` so that none clashes with another plugin's.
"""

from __future__ import annotations

import re
from pathlib import Path

from propel_core.errors import PropelError

KINDS = ("domain", "reward_rule", "probe_head")

PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "propel-{dashed}"
version = "0.1.0"
dependencies = ["propel-core"]

[project.optional-dependencies]
test = ["propel-core[testing]"]  # pytest and propel's fixtures (propel_registry, propel_cli)

[project.entry-points.propel]
{name} = "propel_{name}"

[tool.setuptools]
packages = ["propel_{name}"]  # named, so the tests/ folder beside it is not taken for a module

[tool.ruff]
line-length = 120
"""

HEAD = '''"""propel-{dashed}: {what}.

Installed (``pip install -e .``), ``propel plugins`` lists it; bump ``version`` in pyproject.toml
when what a component computes changes: runs record it and refuse to mix two versions.
"""
'''

DOMAIN = '''

class {camel}Domain(Domain):
    """The generator writes a whole number; the solver answers it doubled. Replace each method with
    your task's: docs/writing_plugins.md says what each one is for."""

    validity_predicates = ("{name}_in_range",)
    stop_strings = ("\\n",)  # a task is one line

    def __init__(self, largest: int = 1000):  # options come from domain.options
        self.largest = largest

    def contexts(self):
        return [Context(id=f"digits-{{n}}", data={{"digits": n}}, bucket=f"{{n}} digits") for n in (1, 2, 3)]

    def generator_prompt(self, context):
        digits = context.data["digits"]
        return [
            {{"role": "user", "content": f"Write a whole number of {{digits}} digits.\\nExample: Number: 47"}},
            {{"role": "assistant", "content": "Number:"}},
        ]

    def parse(self, generation):
        found = re.match(r"Number:\\s*(\\d+)\\s*$", generation.strip())
        if found is None:
            raise ParseError("no 'Number: N' line")
        return {{"n": int(found.group(1))}}

    def render(self, payload):
        return f"What is {{payload['n']}} doubled?"

    def solver_prompt(self, payload):
        return [{{"role": "user", "content": self.render(payload) + " Reply with the number only."}}]

    def grade(self, payload, attempt):  # runs from many threads at once: keep no state on self
        numbers = re.findall(r"-?\\d+", attempt)
        if not numbers:
            return Verdict(False, "no number in the answer")
        solved = int(numbers[-1]) == 2 * payload["n"]
        return Verdict(solved, None if solved else f"answered {{numbers[-1]}}")

    def topic(self, payload):
        return f"{{len(str(payload['n']))}} digits"


def in_range(task, domain):
    if 0 < task.payload["n"] <= domain.largest:
        return Validity.ok()
    return Validity.reject(f"{{task.payload['n']}} is outside 1..{{domain.largest}}")


@hookimpl
def register_domains(register):
    register("{name}", {camel}Domain)


@hookimpl
def register_validity_predicates(register):
    register("{name}_in_range", in_range)
'''

RULE = '''

class {camel}Reward:
    """A reward rule: a valid task earns ``bonus``, an invalid one ``reward.r_bad``. It reads no probe
    score (``needs`` is empty); a rule that does names them (docs/plugin_hooks.md)."""

    needs = frozenset()

    def __init__(self, config, bonus: float = 1.0):  # options come from reward.options.{name}_reward
        self.r_bad, self.bonus = config.r_bad, bonus

    def __call__(self, task, scores):
        return self.bonus if task.validity.valid else self.r_bad


@hookimpl
def register_reward_rules(register):
    register("{name}_reward", {camel}Reward)
'''

PROBE = '''

def {name}_head(input_dim):
    """A probe head: the pooled hidden state to one logit. This layout (Linear, activations, ending in
    Linear(., 1) and Flatten(0)) trains batched with the built-in heads of its layout."""
    from torch import nn

    return nn.Sequential(nn.Linear(input_dim, 64), nn.ReLU(), nn.Linear(64, 1), nn.Flatten(0))


@hookimpl
def register_probe_architectures(register):
    register("{name}_head", {name}_head)
'''

TESTS = '''"""propel-{dashed}'s components, as propel sees them once the package is installed."""
'''

DOMAIN_TESTS = """

def test_the_domain_parses_checks_and_grades(propel_registry):
    domain = propel_registry.domain("{name}", largest=500)  # built by the registry, as propel builds it
    predicates = propel_registry.validity_predicates(domain)
    context = domain.contexts()[0]
    task = make_task("t1", domain, context, "Number: 21", "test", predicates)
    assert task.validity.valid and task.text == "What is 21 doubled?"
    too_large = make_task("t2", domain, context, "Number: 900", "test", predicates)
    assert too_large.validity.reason.startswith("{name}_in_range")
    assert not make_task("t3", domain, context, "twenty", "test", predicates).validity.valid
    assert domain.grade(task.payload, "42").solved and not domain.grade(task.payload, "41").solved
    answers = ("42", "41", "x", "The answer: 42")
    assert_same_verdicts_concurrently(domain, [(task.payload, answer) for answer in answers])


def test_propel_check_finds_no_problem(propel_cli, tmp_path):
    (tmp_path / "run.yaml").write_text("domain: {{name: {name}}}\\n")
    samples = pathlib.Path(__file__).parent / "samples.jsonl"
    result = propel_cli("check", str(tmp_path / "run.yaml"), "--samples", str(samples))
    assert result.stdout.endswith(" 0 problem(s) in 3 sample(s)\\n")
"""

RULE_TESTS = """

def test_the_rule_pays_valid_tasks_its_bonus(propel_registry):
    config = RewardConfig(r_bad=-0.2, options={{"{name}_reward": {{"bonus": 0.5}}}})
    rule = propel_registry.reward_rule("{name}_reward", config)
    task = Task(id="t", domain="d", context_id="c", generation="g", generator="m", validity=Validity.ok())
    assert rule(task, {{}}) == 0.5
    assert rule(task.model_copy(update={{"validity": Validity.reject("bad")}}), {{}}) == -0.2
"""

PROBE_TESTS = """

def test_the_head_gives_a_logit_per_row(propel_registry):
    head = propel_registry.get("probe_architectures", "{name}_head")(16)
    assert head(torch.randn(4, 16)).shape == (4,)
"""

#: kind -> the names its module and its tests import (``from MODULE import NAME``), and plain imports
IMPORTS = {
    "domain": (
        {"propel_core": ("Context", "Domain", "ParseError", "Validity", "Verdict")},
        {"propel_core": ("make_task",), "propel_core.testing": ("assert_same_verdicts_concurrently",)},
        ("re",),
        ("pathlib",),
    ),
    "reward_rule": ({}, {"propel_core": ("Task", "Validity"), "propel_core.config": ("RewardConfig",)}, (), ()),
    "probe_head": ({}, {}, (), ("torch",)),
}

SAMPLES = """\
{"generation": "Number: 21", "attempts": ["42", "41"], "valid": true, "solved": [true, false]}
{"generation": "Number: 7000", "valid": false}
{"generation": "seven", "valid": false}
"""


def new_plugin(folder: Path, name: str, kinds: tuple[str, ...]) -> list[Path]:
    """Write the package ``propel-NAME`` into ``folder`` (new, or empty) with the components ``kinds``
    names; the files written."""
    if not re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", name):
        raise PropelError(
            f"plugin name {name!r}: use lower-case letters and digits, words joined by single _, starting with a letter"
        )
    taken = installed_as(name)
    if taken:
        raise PropelError(f"plugin name {name!r}: {taken} is already installed here; pick another name")
    unknown = [kind for kind in kinds if kind not in KINDS]
    if unknown or not kinds:
        raise PropelError(f"--kind {', '.join(unknown) or '(none)'}: choose from {', '.join(KINDS)}")
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise PropelError(f"{folder} is not empty: name a new folder")
    fields = {"name": name, "dashed": name.replace("_", "-"), "camel": name.title().replace("_", "")}
    what = " and ".join(kind.replace("_", " ") for kind in kinds)
    parts = {"domain": (DOMAIN, DOMAIN_TESTS), "reward_rule": (RULE, RULE_TESTS), "probe_head": (PROBE, PROBE_TESTS)}
    chosen = [kind for kind in KINDS if kind in kinds]
    module = HEAD.format(what=what, **fields) + import_lines(
        [{"propel_core": ("hookimpl",)}, *(IMPORTS[kind][0] for kind in chosen)], [IMPORTS[k][2] for k in chosen]
    )
    tests = TESTS.format(**fields) + import_lines([IMPORTS[k][1] for k in chosen], [IMPORTS[k][3] for k in chosen])
    for kind in chosen:
        module += parts[kind][0].format(**fields)
        tests += parts[kind][1].format(**fields)
    files = {
        "pyproject.toml": PYPROJECT.format(**fields),
        f"propel_{name}/__init__.py": module,
        f"tests/test_{name}.py": tests,
    }
    if "domain" in kinds:
        files["tests/samples.jsonl"] = SAMPLES
    written = []
    try:
        for relative, text in files.items():
            path = folder / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written.append(path)
    except OSError as exc:
        raise PropelError(f"cannot write the package into {folder}: {exc.strerror or exc}") from None
    return written


def installed_as(name: str) -> str | None:
    """What already answers to the names plugin ``name`` would take (the module ``propel_NAME``, the
    distribution ``propel-NAME``, the entry point ``NAME``), or None: ``core`` would replace
    propel-core itself, ``plugins`` shadow the built-ins."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec(f"propel_{name}") is not None:
        return f"a module propel_{name}"
    try:
        importlib.metadata.distribution(f"propel-{name.replace('_', '-')}")
        return f"a distribution propel-{name.replace('_', '-')}"
    except importlib.metadata.PackageNotFoundError:
        pass
    if name in {ep.name for ep in importlib.metadata.entry_points(group="propel")}:
        return f"a plugin named {name}"
    return None


def import_lines(names: list[dict[str, tuple[str, ...]]], plain: list[tuple[str, ...]]) -> str:
    """The import block of a module as ruff's isort writes it in a package of its own: the standard
    library's, then the others' (torch and propel alike), ``import X`` before ``from X import ...``."""
    modules: dict[str, set[str]] = {}
    for part in names:
        for module, found in part.items():
            modules.setdefault(module, set()).update(found)
    standard = sorted({module for part in plain for module in part if module in ("re", "pathlib")})
    others = sorted({module for part in plain for module in part} - set(standard))
    blocks = [
        [f"import {module}" for module in standard],
        [f"import {module}" for module in others]
        + [f"from {module} import {', '.join(sorted(found))}" for module, found in sorted(modules.items())],
    ]
    return "\n" + "\n\n".join("\n".join(block) for block in blocks if block) + "\n"
