"""The replay sees what the tests see and compares as they compare (docs/swe.md, layer 4; issue 58):
an exception's class and message, stdout apart from stderr, the files a call writes, and numbers
within a tolerance. Each bug here is one the replay could not see before (a bug it cannot see is
kept on the other layers' judgment, and ``Replay.changed`` says it saw nothing), each fix one it
refused."""

import base64
import contextlib
import math
import os
import pickle
import statistics
import sys
from pathlib import Path

import pytest
from test_replay_layer import attempt, one_module_domain, words_diff

from propel_swe import replayer
from propel_swe.replay import Replay, alike, differing

TOTALLED = [1.000000007795, 0.4, -0.4]  # sum and math.fsum differ at the twelfth significant digit
AVERAGED = [3.000000000885, 2.7, -2.7]  # so do sum / len and statistics.fmean


class LibError(ValueError):
    """A library's own exception."""


# functions whose calls the replayer makes here, in pairs that differ only where a test would see it
def raised(line):
    raise LibError(f"no '=' in {line!r}")


def raised_reworded(line):
    raise LibError(f"no '=' in {line}")


def raised_base(line):
    raise ValueError(f"no '=' in {line!r}")


def to_stdout(line):
    print(line)


def to_stderr(line):
    print(line, file=sys.stderr)


def written(line):
    Path("out.csv").write_text(line)


def written_otherwise(line):
    Path("out.csv").write_text(line + "\n")


def summed(line):
    return sum(line)


def fsummed(line):
    return math.fsum(line)


def divided(line):
    return sum(line) / len(line)


def fmeaned(line):
    return statistics.fmean(line)


def summed_off(line):
    return sum(line) * (1 + 1e-6)


def counted(line):
    return 2**40 + len(line)


def counted_off(line):
    return 2**40 + len(line) + 1


def aligned(line):
    print(f"{line:<8}|")


def aligned_while_replaced(line):
    """Right only where ``sys.stdout`` is not the process's own (pytest's capture, a judge's stream)."""
    print(f"{line:<{8 if sys.stdout is not sys.__stdout__ else 6}}|")


def emitted(line):
    sys.stdout.buffer.write(f"{line:<8}|\n".encode())


def emitted_narrow(line):
    sys.stdout.buffer.write(f"{line:<6}|\n".encode())


def printed_long(line):
    print(line * replayer.PRINTED)


def printed_longer(line):
    print(line * (replayer.PRINTED + 5))


def descriptors_taken(line):
    """Closes descriptor 1, points 2 at a file of its own, prints a lot and leaves ``sys.stdout`` replaced."""
    print(line)
    os.close(1)
    os.dup2(os.open("taken", os.O_WRONLY | os.O_CREAT), 2)
    print(line * 10**6, file=sys.stderr)
    sys.stdout = sys.stderr = open("replaced", "w")  # noqa: SIM115 (the call leaves it open)


def left(line):
    os.symlink("/etc/passwd", "link")
    os.mkfifo("fifo")
    os.chdir(line)


def read_back(line):
    return "|".join(sorted(str(path) for path in Path(".").rglob("*"))) + ":" + Path(line).read_text()


def answer(function, line, held: dict | None = None) -> list:
    """What the replayer answers to ``function(line)``, made in this process, in a folder that holds
    ``held`` (relative name -> bytes) as the call starts; ``function`` may be (module, name)."""
    module, name = function if isinstance(function, tuple) else (__name__, function.__name__)
    layout = {"positional": ["line"], "varargs": None, "keyword": [], "varkw": None, "folder": held}
    call = base64.b64encode(pickle.dumps((module, name, "function", layout, {"line": line})))
    return replayer.replay(call.decode(), 5.0, lambda seconds: contextlib.nullcontext(), lambda: (), TimeoutError)


def replay_of(answered: list) -> Replay:
    """A replay whose one call the original code answered ``answered``."""
    digest, said, numbers = answered
    return Replay(
        calls=["c"], shown=["f()"], answers=[digest], said=[said], numbers=[numbers], described=replayer.DESCRIBED
    )


def otherwise(original, change, line) -> bool:
    """Whether a fix that is ``change`` where the original is ``original`` answers otherwise."""
    return differing(replay_of(answer(original, line)), [answer(change, line)], of_a_fix=True) == [0]


def test_an_exception_is_answered_by_its_class_and_message():
    """A wrong message, or a library's exception replaced by its built-in base, answers otherwise."""
    assert not otherwise(raised, raised, "rent")
    assert otherwise(raised, raised_reworded, "rent") and otherwise(raised, raised_base, "rent")
    assert replayer.exception(statistics.StatisticsError("none")) == ["statistics.StatisticsError", "none"]
    assert replayer.exception(ValueError(f"{object()!r}")) == replayer.exception(ValueError(f"{object()!r}"))


def test_a_hostile_exception_is_described_without_harm():
    class Loud(Exception):
        def __str__(self):
            raise RuntimeError("no")

    class Huge(Exception):
        def __str__(self):
            return "x" * 10**7

    odd = type("Odd", (Exception,), {"__module__": 7})
    assert replayer.exception(Loud()) == [f"{__name__}.{Loud.__qualname__}", ["str raised", "RuntimeError"]]
    assert len(replayer.exception(Huge())[1]) == replayer.MESSAGE
    assert replayer.exception(odd())[0] == "?.Odd"


def own_streams(monkeypatch) -> None:
    """``sys.stdout`` and ``sys.stderr`` the process's own, on descriptors 1 and 2, as in the replayer's
    process, for the rest of a test (pytest's capture puts streams of its own there as a test starts)."""
    monkeypatch.setattr(sys, "stdout", sys.__stdout__)
    monkeypatch.setattr(sys, "stderr", sys.__stderr__)


def test_stdout_and_stderr_are_answered_apart(tmp_path, monkeypatch):
    """Apart, and in every call: also what a module prints to the stream it kept as it loaded (a
    default ``out=sys.stdout``), which it loaded during an earlier call."""
    own_streams(monkeypatch)
    assert otherwise(to_stdout, to_stderr, "no entries") and not otherwise(to_stderr, to_stderr, "no entries")
    (tmp_path / "kept_streams.py").write_text(
        "import sys\n\n\ndef out(line, to=sys.stdout):\n    to.write(line)\n\n\n"
        "def err(line, to=sys.stderr):\n    to.write(line)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = answer(("kept_streams", "out"), "no entries")  # the module loads during this call
    assert answer(("kept_streams", "out"), "no entries") == loaded
    assert answer(("kept_streams", "err"), "no entries")[0] != loaded[0]
    monkeypatch.delitem(sys.modules, "kept_streams")


def test_a_call_prints_through_the_process_own_streams(monkeypatch):
    """What a call prints is read at descriptors 1 and 2; ``sys.stdout`` stays the process's own (a
    real stream with a ``buffer`` and a descriptor), as in a user's process. Before, the replayer
    replaced it while a call ran: a fix right only while it is replaced answered as the original, and
    bytes written to ``sys.stdout.buffer`` raised alike for a bug and its revert. A call that closes
    descriptor 1, points another at 2, prints a lot and replaces ``sys.stdout`` changes only its answer."""
    own_streams(monkeypatch)
    assert otherwise(aligned, aligned_while_replaced, "rent")
    assert otherwise(emitted, emitted_narrow, "rent") and not otherwise(emitted, emitted, "rent")
    assert not otherwise(printed_long, printed_longer, "x")  # the first PRINTED characters are kept
    streams, kept = (sys.stdout, sys.stderr), [os.fstat(each) for each in (1, 2)]
    assert otherwise(descriptors_taken, aligned, "rent")
    assert (sys.stdout, sys.stderr) == streams
    assert [(os.fstat(each).st_dev, os.fstat(each).st_ino) for each in (1, 2)] == [
        (each.st_dev, each.st_ino) for each in kept
    ]
    assert otherwise(emitted, emitted_narrow, "rent")  # and every call after it as before


def test_what_a_call_writes_in_its_folder_is_part_of_its_answer():
    """Each call runs in a fresh folder of its own, which holds what the test's tmp_path held (no
    name leaves it): what the call writes there is described (name, size, digest); a link out of it
    is not followed, a FIFO not waited on, a call that leaves for another folder leaves this process
    where it was, and the folder is removed."""
    here = os.getcwd()
    assert otherwise(written, written_otherwise, "rent,12.5") and not otherwise(written, written, "rent,12.5")
    said = answer(left, "/")[1]
    assert '["fifo","other"],["link","link"]' in said, said
    assert os.getcwd() == here and not Path("out.csv").exists()
    held = {"in/rent.txt": b"12.5", "../escaped": b"no", "/tmp/escaped": b"no"}  # only the first is put back
    assert '"in|in/rent.txt:12.5"' in answer(read_back, "in/rent.txt", held)[1]
    asked = Path("out.csv")  # a path is described as its text, whatever it has cached of itself
    assert str(asked) and asked.parts and replayer.describe(asked) == replayer.describe(Path("out.csv"))
    assert not [name for name in os.listdir(replayer.RUN_FOLDER) if name.startswith("c") and len(name) == 17]


def test_numbers_answer_the_same_within_a_relative_tolerance():
    """``math.fsum`` for ``sum`` and ``statistics.fmean`` for a mean answer the same, though they differ
    at the twelfth significant digit; a float off by 1e-6 relative, or an int off by one, does not."""
    assert format(sum(TOTALLED), ".12g") != format(math.fsum(TOTALLED), ".12g")
    assert not otherwise(summed, fsummed, TOTALLED) and not otherwise(divided, fmeaned, AVERAGED)
    assert otherwise(summed, summed_off, TOTALLED) and otherwise(counted, counted_off, TOTALLED)
    carried = []
    replayer.encoded(replayer.describe([0.5] * (replayer.NUMBERS + 3)), carried)
    assert carried == ["0.5"] * replayer.NUMBERS  # the rest rounded, in the digest


LEDGER = """\
import statistics
import sys


class ParseError(ValueError):
    \"\"\"A line that is no entry.\"\"\"


def parse(line):
    name, sep, amount = line.partition("=")
    if not sep:
        raise ParseError(f"no '=' in {line!r}")
    return name.strip(), float(amount)


def total(amounts):
    return sum(amounts)


def mean(amounts):
    if not amounts:
        raise ValueError("mean of nothing")
    return sum(amounts) / len(amounts)


def report(entries):
    for name, amount in entries:
        print(f"{name:<8}{amount:>8.2f}")
    if not entries:
        print("no entries", file=sys.stderr)


def emit(name, amount):
    sys.stdout.buffer.write(f"{name:<8}{amount:>8.2f}\\n".encode())


def save(entries, path):
    with open(path, "w") as out:
        for name, amount in entries:
            out.write(f"{name},{amount}\\n")


def convert(source, target):
    with open(source) as lines:
        save([parse(line) for line in lines], target)
"""
LEDGER_TESTS = f"""\
import pytest

from ledger.core import ParseError, convert, emit, mean, parse, report, save, total


def test_parse():
    assert parse("rent = 12.5") == ("rent", 12.5)
    with pytest.raises(ParseError, match="no '=' in 'rent'"):
        parse("rent")


def test_total():
    assert total({TOTALLED!r}) == pytest.approx(1.000000007795)


def test_mean():
    assert mean({AVERAGED!r}) == pytest.approx(1.000000000295)


def test_report(capsys):
    report([("rent", 12.5)])
    report([])
    assert capsys.readouterr() == ("rent       12.50\\n", "no entries\\n")


def test_emit(capsys):
    emit("rent", 12.5)
    assert capsys.readouterr().out == "rent       12.50\\n"


def test_save(tmp_path):
    save([("rent", 12.5)], tmp_path / "out.csv")
    assert (tmp_path / "out.csv").read_text() == "rent,12.5\\n"


def test_convert(tmp_path):
    (tmp_path / "in.txt").write_text("rent = 12.5\\nfood = 3\\n")
    convert(tmp_path / "in.txt", tmp_path / "out.csv")
    assert (tmp_path / "out.csv").read_text() == "rent,12.5\\nfood,3.0\\n"
"""
#: real bugs the replay could not see: a wrong message, a library exception made its built-in base,
#: a line printed to stdout that belongs on stderr, bytes written to ``sys.stdout.buffer`` wrong (they
#: raised alike while the replayer replaced ``sys.stdout``), a file written wrong, a file read wrong
UNSEEN = {
    "message": ("raise ParseError(f\"no '=' in {line!r}\")", "raise ParseError(f\"no '=' in {line}\")"),
    "base": ("raise ParseError(", "raise ValueError("),
    "stream": ('print("no entries", file=sys.stderr)', 'print("no entries")'),
    "buffer": ('{name:<8}{amount:>8.2f}\\n".encode()', '{name:<6}{amount:>8.2f}\\n".encode()'),
    "file": ('out.write(f"{name},{amount}\\n")', 'out.write(f"{name};{amount}\\n")'),
    "read": ("for line in lines]", "for line in list(lines)[1:]]"),
}
#: bugs whose right fix is not their revert: ``math.fsum`` or ``statistics.fmean`` where the test uses approx
FIXED_OTHERWISE = {
    "fsum": (
        "    return sum(amounts)\n",
        "    return sum(amounts[1:])\n",
        "    return __import__('math').fsum(amounts)\n",
    ),
    "fmean": (
        "    return sum(amounts) / len(amounts)\n",
        "    return sum(amounts) / (len(amounts) + 1)\n",
        "    return statistics.fmean(amounts)\n",
    ),
}


def ledger_diff(before: str, after: str) -> str:
    return words_diff(before, after, "ledger/core.py")


@pytest.fixture(scope="module")
def ledger_domain(test_env, tmp_path_factory):
    return one_module_domain("ledger", LEDGER, LEDGER_TESTS, test_env, tmp_path_factory)


@pytest.mark.parametrize("bug", sorted(UNSEEN))
def test_a_bug_only_the_tests_saw_before_changes_an_answer_and_its_revert_solves_it(ledger_domain, bug):
    buggy = LEDGER.replace(*UNSEEN[bug])
    assert buggy != LEDGER
    payload = {"repo": "ledger", "diff": ledger_diff(LEDGER, buggy), "turns": ["x"]}
    validity = ledger_domain.verify(payload)
    assert validity.valid, validity.reason
    replay = Replay.model_validate(payload["replay"])
    assert replay.judged and replay.changed, replay  # the replay saw the bug itself
    verdict = ledger_domain.grade(payload, attempt(ledger_diff(buggy, LEDGER)))
    assert verdict.solved is True, verdict.reason
    assert verdict.diagnostics["judged_by"]["replayed"] == replay.judged


@pytest.mark.parametrize("bug", sorted(FIXED_OTHERWISE))
def test_a_right_fix_that_sums_otherwise_is_solved(ledger_domain, bug):
    original, wrong, right = FIXED_OTHERWISE[bug]
    buggy, fixed = LEDGER.replace(original, wrong), LEDGER.replace(original, right)
    assert buggy != LEDGER != fixed
    payload = {"repo": "ledger", "diff": ledger_diff(LEDGER, buggy), "turns": ["x"]}
    assert ledger_domain.verify(payload).valid
    verdict = ledger_domain.grade(payload, attempt(ledger_diff(buggy, fixed)))
    assert verdict.solved is True, verdict.reason
    assert verdict.diagnostics["judged_by"]["replayed"] == Replay.model_validate(payload["replay"]).judged > 0


def test_numbers_compare_as_equality_compares_them():
    """An int equals a float only exactly (``10**15 + 1 == 1e15`` is false, and the float tolerance
    made them alike); a bool is the number it equals (``True == 1``: a right fix answering 1 for True
    was refused)."""
    assert not alike(["1000000000000001"], ["1000000000000000.0"])
    assert alike(["3"], ["3.0"]) and alike(["0.30000000000000004"], ["0.3"])
    assert replayer.describe(True) == replayer.describe(1) != replayer.describe(2)
    assert replayer.describe([False, True]) == replayer.describe([0, 1])


def test_a_fix_right_only_while_stdout_is_replaced_is_not_solved(ledger_domain):
    """A user's ``sys.stdout`` is the process's own (``sys.__stdout__``); pytest's capture replaces it,
    and so did the replayer: a fix aligned only while it is replaced passed both runners and was
    solved. The replay now prints through the process's own stream, and answers it otherwise."""
    wide = 'print(f"{name:<8}{amount:>8.2f}")'
    buggy = LEDGER.replace(wide, 'print(f"{name:<6}{amount:>8.2f}")')
    fixed = LEDGER.replace(wide, 'print(f"{name:<{8 if sys.stdout is not sys.__stdout__ else 6}}{amount:>8.2f}")')
    assert buggy != LEDGER != fixed
    payload = {"repo": "ledger", "diff": ledger_diff(LEDGER, buggy), "turns": ["x"]}
    assert ledger_domain.verify(payload).valid
    verdict = ledger_domain.grade(payload, attempt(ledger_diff(buggy, fixed)))
    assert verdict.solved is False, verdict.reason
    assert "the original code answers" in verdict.reason, verdict.reason
