"""The AZR static filter against two cheap escape classes that once passed it (the sandbox contained
both): attribute chains from an imported module to sys/builtins/os, and string formatting that walks
attributes (``string.Formatter().get_field``, ``'{0.__class__}'.format``). The filter is a quality
filter; the sandbox stays the security boundary (test_attacks.py)."""

import json
from importlib.resources import files

import pytest

from propel_azr.plugin import check_static
from propel_core.records import Task, Validity


def static(code: str) -> Validity:
    task = Task(
        id="t",
        domain="azr",
        context_id="c",
        generation="",
        generator="m",
        validity=Validity.ok(),
        payload={"code": code, "inputs": [], "message": "m"},
    )
    return check_static(task, None)


def body(*lines: str, imports: str = "") -> str:
    return imports + "def f(x):\n" + "".join(f"    {line}\n" for line in lines)


# name -> (code, the start of the reason the filter gives)
ESCAPES = {
    # attribute chains from a module to the rest of the interpreter
    "random_private_os": (
        body("random._os.system('id')", "return x", imports="import random\n"),
        "imports a module outside the allowed set: random",
    ),
    "typing_sys_modules": (
        body("return typing.sys.modules['os']", imports="import typing\n"),
        "imports a module outside the allowed set: typing",
    ),
    "collections_abc_sys": (
        body("return collections.abc.sys.modules['os'].system('id')", imports="import collections.abc\n"),
        "uses the banned attribute system",
    ),
    "collections_private_sys": (
        body("return collections._sys.modules", imports="import collections\n"),
        "uses the banned attribute modules",
    ),
    "collections_private_sys_alone": (
        body("s = collections._sys", "return x", imports="import collections\n"),
        "uses the private attribute _sys",
    ),
    "string_private_re": (body("return string._re", imports="import string\n"), "uses the private attribute _re"),
    "re_enum_sys": (body("return re.enum.sys", imports="import re\n"), "uses the banned attribute sys"),
    "re_copyreg_alias": (
        body("m = re.copyreg", "return m", imports="import re\n"),
        "uses the banned attribute copyreg",
    ),
    "aliased_module_sys": (
        body("m = c.abc", "return m.sys", imports="import collections.abc as c\n"),
        "uses the banned attribute sys",
    ),
    "from_import_module": (
        body("return enum", imports="from re import enum\n"),
        "imports the banned name enum from re",
    ),
    "from_import_private": (
        body("return _sys", imports="from collections import _sys\n"),
        "imports the banned name _sys from collections",
    ),
    "import_private_submodule": (
        body("return x", imports="import re._compiler\n"),
        "imports the private module re._compiler",
    ),
    "generator_frame_builtins": (
        body("g = (i for i in [x])", "return g.gi_frame.f_builtins['ev' + 'al']('1')"),
        "uses the banned attribute f_builtins",
    ),
    "mro_to_object": (body("return type(x).mro()[-1]"), "uses the banned attribute mro"),
    "functools_globals": (
        body("return functools.partial(abs).func.__globals__", imports="import functools\n"),
        "uses the dunder attribute __globals__",
    ),
    # string formatting that walks attributes or items
    "formatter_get_field": (
        body("return string.Formatter().get_field('0.__class__.__base__', [x], {})", imports="import string\n"),
        "uses the banned attribute get_field",
    ),
    "formatter_no_dunder": (
        body("return string.Formatter().get_field('0.real', [x], {})[0]", imports="import string\n"),
        "uses the banned attribute get_field",
    ),
    "from_string_formatter": (
        body("return Formatter().vformat('{0.real}', [x], {})", imports="from string import Formatter\n"),
        "imports the banned name Formatter from string",
    ),
    "formatter_subclass": (
        body("class F(string.Formatter):", "    pass", "return F().format('{0}', x)", imports="import string\n"),
        "uses the banned attribute Formatter",
    ),
    "format_dunder_field": (body("return '{0.__class__}'.format(x)"), "calls format with a field that walks"),
    "format_attribute_field": (body("return '{0.real.imag}'.format(x)"), "calls format with a field that walks"),
    "format_item_field": (body("return '{0[0]}'.format(x)"), "calls format with a field that walks"),
    "format_nested_field": (body("return '{0:{1.real}}'.format(x, 5)"), "calls format with a field that walks"),
    "format_map_field": (body("return '{a.real}'.format_map({'a': x})"), "calls format_map with a field that walks"),
    "str_format_field": (body("return str.format('{0.real}', x)"), "calls format with a field that walks"),
    # str rebound to a walking template, then str.format on an innocent-looking literal
    "str_rebound_template": (
        body("str = '{1.' + 'real}'", "return str.format('ok', x)"),
        "binds the name str",
    ),
    "str_rebound_by_a_parameter": (body("return (lambda str: str.format('ok', x))('{1.real}')"), "binds the name str"),
    # names that enter scope without being named: Formatter through a star import
    "star_import_formatter": (
        body("return Formatter().vformat('{0}', [x], {})", imports="from string import *\n"),
        "imports every name of string",
    ),
    "dunder_bytes_literal": (body("return b'__class__'.decode()"), "a string literal contains __"),
    "format_computed_template": (
        body("t = '{0' + '.real}'", "return t.format(x)"),
        "calls format on a computed format string",
    ),
    "format_computed_inline": (body("return ('{0' + '.real}').format(x)"), "calls format on a computed format string"),
    "format_method_taken": (body("g = '{0}'.format", "return g(x)"), "uses format other than called"),
    "dunder_string_literal": (body("key = '__cla' + 'ss__'", "return key"), "a string literal contains __"),
    "dunder_in_fstring_text": (body("return f'__{x}'"), "a string literal contains __"),
}


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_escape_refused(name):
    code, reason = ESCAPES[name]
    compile(code, name, "exec")  # each is real Python
    validity = static(code)
    assert not validity.valid, name
    assert validity.reason.startswith(reason), validity.reason


ORDINARY = [
    body("return sorted(x, key=lambda v: (v % 3, v))"),
    body("return re.sub(r'\\d+', '#', x)", imports="import re\n"),
    body("pattern = re.compile(r'[aeiou]')", "return len(pattern.findall(x))", imports="import re\n"),
    body("return Counter(x).most_common(1)[0][0]", imports="from collections import Counter\n"),
    body("return isinstance(x, collections.abc.Iterable)", imports="import collections.abc\n"),
    body("return '{:>5}|{:03d}|{}-{name}'.format(x, x, x, name='n')"),
    body("return '{0}{0!r}'.format(x) + str.format('{:.2f}', x)"),
    body("return f'{x:>{x % 5 + 1}}'"),
    body(
        "return x.translate(str.maketrans(string.ascii_lowercase, string.ascii_uppercase))", imports="import string\n"
    ),
    body(
        "xs = list(x)",
        "xs.remove(max(xs))",
        "heapq.heapify(xs)",
        "return [heapq.heappop(xs) for _ in xs[:2]]",
        imports="import heapq\n",
    ),
    body(
        "return functools.reduce(math.gcd, x, 0) + bisect.bisect_left(sorted(x), 3)",
        imports="import bisect\nimport functools\nimport math\n",
    ),
    body("return [''.join(p) for p in itertools.permutations(x, 2)]", imports="import itertools\n"),
    body(
        "class Node:",
        "    def __init__(self, value):",
        "        self.value = value",
        "return [Node(v).value * 2 for v in x]",
    ),
    body("return x.replace('_', '-').split('-')"),
    body(
        "class Pair:",
        "    def __init__(self, a, b):",
        "        self.a, self.b = a, b",
        "    def __lt__(self, other):",
        "        return self.b < other.b",
        "return [p.a for p in sorted(Pair(i, -v) for i, v in enumerate(x))]",
    ),
]


@pytest.mark.parametrize("code", ORDINARY)
def test_ordinary_program_accepted(code):
    compile(code, "f", "exec")
    assert static(code) == Validity.ok()


def test_every_seed_passes_the_filter():
    seeds = [json.loads(line) for line in files("propel_azr").joinpath("seeds.jsonl").read_text().splitlines()]
    assert len(seeds) >= 60
    for seed in seeds:
        assert static(seed["code"]) == Validity.ok(), seed["code"]
