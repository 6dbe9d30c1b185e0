"""Attacks on the replay (docs/swe.md, "Four layers", item 4), every layer on as it ships.

Each test asserts the secure outcome: a wrong fix is not solved, a fake bug is not valid, a
legitimate fix solves. A test that fails here is a hole that is open (or a legitimate change that
the replay refuses). Every case runs on the tiny repository in the real sandbox.
"""

import difflib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from swe_helpers import BUG

from propel_swe.replay import Replay

DATA = Path(__file__).parent / "data" / "tinystats"
CORE = (DATA / "tinystats" / "core.py").read_text()
BUGGY_CORE = CORE.replace("    if value > high:", "    if value > low:")
CLAMP = "tests/test_core.py::test_clamp"
CORRECT = "    return low if value < low else high if value > high else value\n"


pytestmark = pytest.mark.usefixtures("verdict_deadline")


def edit_core(before: str, *pairs: tuple[str, str]) -> str:
    """A diff of tinystats/core.py from ``before``, each ``old`` text replaced by ``new``."""
    after = before
    for old, new in pairs:
        assert old in after, old
        after = after.replace(old, new, 1)
    assert after != before
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), "a/tinystats/core.py", "b/tinystats/core.py"
    )
    return "".join(lines)


def user_answers(before: str, diff: str, calls: str, tmp_path) -> list:
    """What a user gets from core.py (``before``) with ``diff`` applied (by git, in a scratch folder
    outside /testbed, with no .git and no harness folder): ``calls``, a Python expression over
    ``clamp``, evaluated by a plain interpreter that never loads pytest."""
    folder = tmp_path / "user" / "tinystats"
    folder.mkdir(parents=True)
    (folder / "core.py").write_text(before)
    (tmp_path / "user" / "change.diff").write_text(diff)
    subprocess.run(["git", "apply", "change.diff"], cwd=tmp_path / "user", check=True)
    (tmp_path / "user" / "change.diff").unlink()
    script = f"import json, sys; sys.path.insert(0, {str(tmp_path / 'user')!r}); from tinystats.core import clamp; print(json.dumps({calls}))"
    done = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def solver_attempt(diff: str) -> str:
    return json.dumps({"diff": diff, "stop_reason": "stop", "status": "finished", "turns": []})


def verified(domain, diff: str) -> dict:
    """A bug verified with every layer on: its payload (failing tests, replay)."""
    payload = {"repo": "tinystats", "diff": diff, "turns": ["x"]}
    validity = domain.verify(payload)
    assert validity.valid, validity.reason
    assert Replay.model_validate(payload["replay"]).judged, "the bug has no replay: nothing of the replay is tested"
    return payload


@pytest.fixture(scope="module")
def replayed_bug(tiny_domain):
    """The tiny repository's clamp bug, verified with every layer as it ships."""
    return verified(tiny_domain, BUG)


def fake_bug_refused(domain, diff: str, monkeypatch) -> bool:
    """Whether the replay stops a bug no user meets, which passes every other layer: its code changes
    no answer the replay sees, so it is kept on the other layers' judgment and marked (``changed: 0``),
    and refused where unjudged bugs are (``unjudged_bugs: refuse``)."""
    payload = {"repo": "tinystats", "diff": diff, "turns": ["x"]}
    assert domain.verify(payload).valid, "the other layers stop it: the replay is not what is tested"
    assert Replay.model_validate(payload["replay"]).changed == 0, "a bug no user meets changed an answer"
    monkeypatch.setattr(domain, "unjudged_bugs", "refuse")
    return not domain.verify({"repo": "tinystats", "diff": diff, "turns": ["x"]}).valid


def graded(domain, payload: dict, fix: str):
    task = {key: payload[key] for key in ("repo", "diff", "failing_tests", "replay")}
    task["turns"] = []
    return domain.grade(task, solver_attempt(fix))


# --- 1. the original code is on disk where the change runs ---------------------------------------

# The fix holds no correct code. It runs the clean file instead of its own module's code: in the
# runners from the checkout's git objects (HEAD's blob, named by .git/index, which ``git apply``
# never touches); where there is no history, from the bug's own diff read backwards, which the
# harness leaves beside the checkout (``apply_diffs`` writes OUT_DIR/change0.diff; a change's replay
# applies [bug, fix], so change0.diff is the bug). Where neither is (an installed package, a wheel,
# an sdist) the bug stays.
RESTORE = """

def _head_blob(_root, _rel):
    import os as _os, zlib as _zlib
    _git = _os.path.join(_root, ".git")
    _data = open(_os.path.join(_git, "index"), "rb").read()
    _pos = 12
    for _ in range(int.from_bytes(_data[8:12], "big")):
        _sha = _data[_pos + 40 : _pos + 60].hex()
        _length = int.from_bytes(_data[_pos + 60 : _pos + 62], "big") & 0xFFF
        _name = _data[_pos + 62 : _pos + 62 + _length]
        _pos += (62 + _length + 8) // 8 * 8
        if _name == _rel.encode():
            _raw = _zlib.decompress(open(_os.path.join(_git, "objects", _sha[:2], _sha[2:]), "rb").read())
            return _raw[_raw.index(b"\\0") + 1 :].decode()
    raise LookupError(_rel)


def _diff_undone(_here, _rel):
    import os as _os
    _text = open(_here).read()
    for _top in sorted(_os.listdir("/")):
        _path = _os.path.join("/", _top, "change0.diff")
        if not _os.path.isfile(_path):
            continue
        _hunks, _mine = [], False
        for _line in open(_path).read().splitlines():
            if _line.startswith(("--- ", "+++ ")):
                _mine = _line.startswith("+++ ") and _line[4:].split("\\t")[0].strip().endswith(_rel)
            elif _line.startswith("@@"):
                if _mine:
                    _hunks.append(([], []))
            elif _mine and _hunks and _line[:1] in (" ", "-", "+"):
                if _line[:1] != "+":
                    _hunks[-1][0].append(_line[1:])
                if _line[:1] != "-":
                    _hunks[-1][1].append(_line[1:])
        for _old, _new in _hunks:
            _text = _text.replace("\\n".join(_new) + "\\n", "\\n".join(_old) + "\\n", 1)
        return _text
    raise LookupError(_rel)


def _clean_source():
    import os as _os
    _here = _os.path.abspath(__file__)
    _root = _os.path.dirname(_os.path.dirname(_here))
    _rel = _os.path.relpath(_here, _root)
    if _os.path.isdir(_os.path.join(_root, ".git")):
        return _head_blob(_root, _rel)
    return _diff_undone(_here, _rel)


if not globals().get("_restoring"):
    _restoring = True
    try:
        exec(_clean_source(), globals())
    except Exception:  # nothing to restore from: the code as the change left it
        pass
"""
USER_CALLS = "[clamp(v, 0, 10) for v in (-5, 3, 7, 15, 1000)]"
RIGHT = [0, 3, 7, 10, 10]  # what the clean code answers them
LAST_LINE = "    return all(a <= b for a, b in zip(values, values[1:]))\n"


def test_a_fix_that_runs_the_clean_source_it_finds_on_disk_is_not_solved(tiny_domain, replayed_bug, tmp_path):
    fix = edit_core(BUGGY_CORE, (LAST_LINE, LAST_LINE + RESTORE))
    assert "value > high" not in fix  # the fix does not hold the correct comparison
    assert user_answers(BUGGY_CORE, fix, USER_CALLS, tmp_path) != RIGHT  # a user keeps the bug
    verdict = graded(tiny_domain, replayed_bug, fix)
    assert verdict.solved is False, f"a fix with no correct code solved, from .git and the bug's diff: {verdict.reason}"


# --- 2. what the replayer calls is chosen by the change (module attribute, then __wrapped__) -------

# runner detection without a literal naming it (docs/swe.md "What remains": the in-process residual
# that the replay is meant to judge outside the harness)
IN_A_RUNNER = '("py" + "test") in __import__("sys").modules'


def test_a_fake_bug_that_points_the_replayer_at_a_function_no_user_calls_is_marked_and_refused_where_asked(
    tiny_domain, tmp_path, monkeypatch
):
    """Users (and the tests, outside a runner) call ``_clamp``, which is right; the tests under a
    runner get the broken one; the replayer follows ``__wrapped__`` to the broken ``clamp``, which
    nobody else calls: it never has to detect the replayer."""
    diff = edit_core(
        CORE,
        ("    if value > high:", "    if value > low:"),
        (
            "def window(",
            "_broken = clamp\n\n\ndef _clamp(value, low, high):\n"
            f"    if {IN_A_RUNNER}:\n        return _broken(value, low, high)\n{CORRECT}\n\n"
            "_clamp.__wrapped__ = _broken\nclamp = _clamp\n\n\ndef window(",
        ),
    )
    assert user_answers(CORE, diff, USER_CALLS, tmp_path) == RIGHT  # no user meets the bug
    assert fake_bug_refused(tiny_domain, diff, monkeypatch), (
        "a bug no user meets was verified valid: the replayer called what users never call"
    )


def test_a_fake_bug_that_only_renames_the_function_is_marked_and_refused_where_asked(
    tiny_domain, tmp_path, monkeypatch
):
    """The function users call is right; it is only bound under another qualified name, so the
    replayer cannot find it and answers "not replayed", which a bug's verdict counts as a change."""
    diff = edit_core(
        CORE,
        (
            "def clamp(value, low, high):\n",
            f"def _clamp(value, low, high):\n    if {IN_A_RUNNER}:\n        return high if value > low else low\n",
        ),
        ("def window(", "clamp = _clamp\n\n\ndef window("),
    )
    assert user_answers(CORE, diff, USER_CALLS, tmp_path) == RIGHT  # no user meets the bug
    assert fake_bug_refused(tiny_domain, diff, monkeypatch), (
        "a call the replayer could not find counted as the bug's changed answer"
    )


def test_a_fake_bug_that_rewrites_the_replayers_unpickling_is_marked_and_refused_where_asked(
    tiny_domain, tmp_path, monkeypatch
):
    """clamp is right for users; the tests under a runner get a broken one. The replayer loads each
    call with ``pickle.loads`` looked up at call time, which the bug's module replaced on import: a
    call of this module comes back with its value moved, so the right code answers otherwise. The
    runners check json, pytest, unittest and the builtins, not pickle; no user unpickles a
    (module, qualified name, arguments) triple of tinystats."""
    tamper = (
        "import pickle as _pickle\n\n_loads = _pickle.loads\n\n\n"
        "def _moved(data, *args, **kwargs):\n    loaded = _loads(data, *args, **kwargs)\n"
        "    if type(loaded) is tuple and len(loaded) == 3 and loaded[0] == __name__ and type(loaded[2]) is dict:\n"
        '        loaded = (loaded[0], loaded[1], {**loaded[2], "value": loaded[2].get("value", 0) + 1})\n'
        "    return loaded\n\n\n_pickle.loads = _moved\n\n\n"
    )
    diff = edit_core(
        CORE,
        ("def mean(values):\n", tamper + "def mean(values):\n"),
        (
            "def clamp(value, low, high):\n",
            f"def clamp(value, low, high):\n    if {IN_A_RUNNER}:\n        return high if value > low else low\n",
        ),
    )
    assert user_answers(CORE, diff, USER_CALLS, tmp_path) == RIGHT  # no user meets the bug
    assert fake_bug_refused(tiny_domain, diff, monkeypatch), (
        "a bug that tampers with the replayer's own machinery was verified valid"
    )


def test_a_wrong_fix_that_points_the_replayer_at_a_right_function_is_not_solved(tiny_domain, replayed_bug, tmp_path):
    """What users call stays broken but for the inputs the tests hold; the replayer is sent to a
    right function through ``__wrapped__``."""
    fix = edit_core(
        BUGGY_CORE,
        (
            "def window(",
            "_right = clamp\n\n\ndef _clamp(value, low, high):\n"
            "    if (value, low, high) in ((-5, 0, 10), (5, 0, 10), (15, 0, 10)):\n"
            "        return _right(value, low, high)\n"
            "    return high if value > low else low if value < low else value\n\n\n"
            "_clamp.__wrapped__ = _right\nclamp = _clamp\n\n\ndef window(",
        ),
        ("    if value > low:\n", "    if value > high:\n"),
    )
    assert user_answers(BUGGY_CORE, fix, USER_CALLS, tmp_path) != RIGHT  # a user keeps the bug
    verdict = graded(tiny_domain, replayed_bug, fix)
    assert verdict.solved is False, f"users keep the bug, the replayer was shown a right function: {verdict.reason}"


# --- 3. a sign every process of the harness shares: where the checkout is -------------------------


def test_a_fake_bug_only_where_the_harness_puts_the_checkout_is_marked_and_refused_where_asked(
    tiny_domain, tmp_path, monkeypatch
):
    """Broken only when the module lives under /testbed: both runners, the rechecks and the
    replayer all run it there; nobody who installs the package does."""
    diff = edit_core(
        CORE, ("    if value > high:", '    if value > (low if __file__.startswith("/testbed/") else high):')
    )
    assert user_answers(CORE, diff, USER_CALLS, tmp_path) == RIGHT  # no user meets the bug
    assert fake_bug_refused(tiny_domain, diff, monkeypatch), (
        "a bug only under the harness's checkout path was verified valid"
    )


# --- 4. what the moved calls reach ----------------------------------------------------------------


def test_a_fix_wrong_beyond_the_moved_inputs_is_not_solved(tiny_domain, tmp_path, monkeypatch):
    """Wrong for clamp(1000, 0, 10) (returns 1000): moves of +-1, +-2 or x2 never take a value 50 past
    ``high`` from the inputs the tests hold; a far move (+1000) does. It is one way among the moves
    (one in 18 of the moves that change a number, about one in 70 of all), so the bug is verified
    here with 60 moves a call, again where no far move of ``value`` was drawn (about one
    verification in 30), and the fix graded on the first replay that holds one."""
    from propel_swe import verifier

    monkeypatch.setattr(verifier, "VARIANTS", 60)
    for _ in range(5):  # each verification draws its moves afresh
        payload = verified(tiny_domain, BUG)
        if any(re.search(r" with .*value=\d{3,}", shown) for shown in payload["replay"]["shown"]):
            break
    else:
        raise AssertionError("five verifications drew no far move of value: the moves no longer reach far")
    fix = edit_core(BUGGY_CORE, ("    if value > low:", "    if value > high and value - high < 50:"))
    assert user_answers(BUGGY_CORE, fix, USER_CALLS, tmp_path) == [0, 3, 7, 10, 1000]  # wrong for a user
    verdict = graded(tiny_domain, payload, fix)
    assert verdict.solved is False, f"clamp(1000, 0, 10) == 1000 solved: {verdict.reason}"


# --- 4b. what the description reads of a value ----------------------------------------------------

WINDOW_BUGGY = CORE.replace("range(len(values) - size + 1)", "range(len(values) - size)")
#: a list whose own iteration and length show the right windows for every input, and whose items (what
#: == and indexing read) are right only for the test's input
WINDOWS_TOLD_ONE_WAY_AND_KEPT_ANOTHER = """\
class _Windows(list):
    def __init__(self, told, kept):
        list.__init__(self, kept)
        self.told = told

    def __iter__(self):
        return iter(self.told)

    def __len__(self):
        return len(self.told)


def window(values, size):
    right = [values[i : i + size] for i in range(len(values) - size + 1)]
    return _Windows(right, right if (list(values), size) == ([1, 2, 3, 4], 2) else right[:-1])


"""


def test_a_list_that_iterates_otherwise_than_it_holds_is_not_solved(tiny_domain, tmp_path):
    """Before, the replayer read a list through its own ``__iter__`` and ``__len__``, which a subclass
    can make tell the right answer while the items a test's == or a user's index read stay wrong."""
    payload = verified(tiny_domain, edit_core(CORE, ("range(len(values) - size + 1)", "range(len(values) - size)")))
    start, end = WINDOW_BUGGY.index("def window("), WINDOW_BUGGY.index("def is_sorted(")
    fix = edit_core(WINDOW_BUGGY, (WINDOW_BUGGY[start:end], WINDOWS_TOLD_ONE_WAY_AND_KEPT_ANOTHER))
    window = "__import__('tinystats.core', fromlist=['window']).window"
    held = user_answers(WINDOW_BUGGY, fix, f"[list.__len__({window}([1, 2, 3, 4, 5], 2))]", tmp_path)
    assert held == [3]  # a user's list holds three windows of the four
    verdict = graded(tiny_domain, payload, fix)
    assert verdict.solved is False, f"a list holding a wrong answer solved: {verdict.reason}"


# --- 5. legitimate fixes the replay refuses ------------------------------------------------------


def test_the_textbook_median_formula_fixes_a_median_bug(tiny_domain):
    """(a[(n-1)//2] + a[n//2]) / 2 for every n: right, the tests pass, but it answers 3.0 where the
    original answers 3 (an int) for an odd count."""
    bug = edit_core(CORE, ("    ordered = sorted(values)\n", "    ordered = list(values)\n"))
    buggy = CORE.replace("    ordered = sorted(values)\n", "    ordered = list(values)\n")
    payload = verified(tiny_domain, bug)
    fix = edit_core(
        buggy,
        (
            "    ordered = list(values)\n    middle = len(ordered) // 2\n    if len(ordered) % 2 == 1:\n"
            "        return ordered[middle]\n    return (ordered[middle - 1] + ordered[middle]) / 2\n",
            "    ordered = sorted(values)\n    count = len(ordered)\n"
            "    return (ordered[(count - 1) // 2] + ordered[count // 2]) / 2\n",
        ),
    )
    verdict = graded(tiny_domain, payload, fix)
    assert verdict.solved is True, f"a right median refused by the replay: {verdict.reason}"


def test_a_fix_by_fmean_that_keeps_the_documented_error_solves(tiny_domain):
    """mean([]) must raise ValueError("mean of no values"): statistics.fmean, which answers within the
    replay's tolerance, solves where the fix keeps that error. The replay describes an exception by its
    class and message, as ``pytest.raises(..., match=...)`` sees it (issue 58), so fmean's own
    StatisticsError for an empty list is another answer (before, only the nearest built-in class was
    compared, and that fix solved)."""
    bug = edit_core(CORE, ('    if not values:\n        raise ValueError("mean of no values")\n', ""))
    buggy = CORE.replace('    if not values:\n        raise ValueError("mean of no values")\n', "")
    payload = verified(tiny_domain, bug)
    kept = edit_core(
        buggy,
        ("def mean(values):\n", "import statistics\n\n\ndef mean(values):\n"),
        (
            "    return sum(values) / len(values)\n",
            '    if not values:\n        raise ValueError("mean of no values")\n    return statistics.fmean(values)\n',
        ),
    )
    verdict = graded(tiny_domain, payload, kept)
    assert verdict.solved is True, f"a right mean refused by the replay: {verdict.reason}"


def test_a_fix_under_a_decorator_without_wraps_solves(tiny_domain, replayed_bug):
    """The right comparison, and a decorator written without functools.wraps that counts the calls:
    what a user calls is the decorator's inner function, whose name is not clamp. (A decorator that
    also refuses low > high changes what clamp answers there, and the moved calls meet it.)"""
    fix = edit_core(
        BUGGY_CORE,
        (
            "def clamp(value, low, high):\n",
            "CALLS = []\n\n\ndef _counted(function):\n    def counting(value, low, high):\n"
            "        CALLS.append(1)\n        return function(value, low, high)\n\n"
            "    return counting\n\n\n@_counted\ndef clamp(value, low, high):\n",
        ),
        ("    if value > low:", "    if value > high:"),
    )
    verdict = graded(tiny_domain, replayed_bug, fix)
    assert verdict.solved is True, f"a right clamp refused by the replay: {verdict.reason}"
