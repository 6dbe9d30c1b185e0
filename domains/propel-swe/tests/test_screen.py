"""The static screen of bugs and fixes (no sandbox): what it refuses, the ordinary code it lets
through, and that it refuses no real bug or fix on the repositories the project tries (every
procedural mutation of six and tinystats, and the revert of each)."""

import ast
from pathlib import Path

import pytest

from propel_swe.procedural import mutate, sites
from propel_swe.screen import screen

TINY = Path(__file__).parent / "data" / "tinystats"
INIT = (TINY / "tinystats" / "__init__.py").read_text()
CORE = (TINY / "tinystats" / "core.py").read_text()


def added(code: str, source: str = INIT) -> list[str]:
    return screen({"pkg.py": source}, {"pkg.py": source + "\n" + code})


@pytest.mark.parametrize(
    "code, problem",
    [
        # a value equal to everything passes an assertion for real, under any runner
        ("class Any:\n    def __eq__(self, other):\n        return True", "defines __eq__ that ignores an argument"),
        ("class Same:\n    def __hash__(self):\n        return 0", "defines __hash__ that ignores an argument"),
        ("class Ne:\n    def __ne__(self, other):\n        return False", "defines __ne__ that ignores an argument"),
        ("class Any:\n    __eq__ = lambda self, other: True", "assigns __eq__"),
        ("class Any:\n    pass\n\n\nAny.__eq__ = lambda self, other: True", "assigns __eq__"),
        ("class Any:\n    pass\n\n\nsetattr(Any, '__hash__', lambda self: 0)", "assigns __hash__"),
        # asking whether a runner is loaded, spelled as code spells it
        ("import sys\ndef mean(values):\n    return 'pytest' in sys.modules", "names pytest in a string"),
        ("import sys\ndef mean(values):\n    return sys.modules.get('_pytest.runner')", "names pytest in a string"),
        ("def mean(values):\n    return 'PYTEST_CURRENT_TEST'", "names pytest in a string"),
        ("import sys\n_UT = sys.modules.get('unittest')", "names unittest in a string"),
        ("_P = b'propel_report'", "names propel in a string"),
    ],
)
def test_the_screen_refuses(code, problem):
    problems = added(code)
    assert any(problem in line for line in problems), problems


@pytest.mark.parametrize(
    "code",
    [
        "def mean(values):\n    return sum(values) / max(len(values), 1)",
        "LIMIT = 10\nNAMES = ('a', 'b')",
        "class Pair:\n    def __eq__(self, other):\n        return self.key == other.key",
        "def mean(values):\n    return getattr(values, 'total', 0)",
        "def mean(values, key):\n    return getattr(values, key)",
        # what the first screen refused and a fix writes every day (what they may do at run time is
        # the guard's to deny)
        "import re\n_WORD = re.compile(r'\\w+')",
        "_MISSING = object()",
        "import inspect\nimport types\n_S = inspect.signature\n_E = types.MappingProxyType({})",
        "import functools\n@functools.lru_cache(maxsize=None)\ndef _sq(x):\n    return x * x",
        "import dataclasses\n@dataclasses.dataclass\nclass P:\n    x: int = 0",
        'def helper():\n    """Covered by the pytest suite; see unittest too."""\n    return None',
        "def mean(values):\n    raise ValueError('run pytest -k mean to see why')",
        "import os, sys\ndef mean(values):\n    return os.environ.get('HOME'), sys.platform",
    ],
)
def test_the_screen_lets_ordinary_code_through(code):
    assert added(code) == []


def test_what_the_file_already_had_is_not_the_changes():
    """A feature the file had before (or, for a fix, the clean file had) is not counted, however many
    times the change writes it again, and a fix may restore what a bug removed."""
    source = "def same(a, b):\n    return 'pytest'\n"
    assert screen({"m.py": source}, {"m.py": source + "\n\ndef again():\n    return 'pytest'\n"}) == []
    bug = source.replace("'pytest'", "None")
    assert screen({"m.py": bug}, {"m.py": source}) == ["m.py: names pytest in a string"]
    assert screen({"m.py": bug}, {"m.py": source}, original={"m.py": source}) == []
    prop = "class C:\n    @property\n    def a(self):\n        return 1\n"
    assert screen({"m.py": prop}, {"m.py": prop + "\n    @property\n    def b(self):\n        return 2\n"}) == []


def every_mutation(path: str, source: str) -> list[str]:
    found = (mutate(site, source) for site in sites(path, ast.parse(source)))
    return [mutated for mutated in found if mutated is not None]


@pytest.mark.parametrize("name", ["tinystats/core.py", "tinystats/__init__.py", "six.py"])
def test_no_procedural_bug_nor_its_revert_is_refused(name, six_repo):
    """Every mutation the procedural generator makes of the repositories the project tries, and its
    revert (the real fix), passes the screen."""
    source = ((six_repo / name) if name == "six.py" else (TINY / name)).read_text()
    mutants = every_mutation(name, source)
    assert len(mutants) >= (100 if name == "six.py" else 0)
    refused = [problems for mutant in mutants if (problems := screen({name: source}, {name: mutant}))]
    reverted = [problems for mutant in mutants if (problems := screen({name: mutant}, {name: source}, {name: source}))]
    assert refused == [] and reverted == [], (refused[:3], reverted[:3])


def test_what_python_would_read_otherwise_is_refused():
    """A coding cookie makes Python read other code than the text the screen parses (UTF-7 hides an
    import in a comment); a file the screen cannot parse is refused, never passed."""
    hidden = "# coding: utf-7\n# +AAo-import gc\n"
    assert added(hidden, source="")[0].endswith("declares the source encoding utf-7")
    assert screen({"m.py": INIT}, {"m.py": INIT + "\ndef broken(:\n"}) == [
        "m.py: does not parse (the screen passes nothing it cannot read)"
    ]
