"""The replay: a verdict on what the code does, made where the code under test cannot reach it.

The tests' verdict comes from the process that runs the change's code, and a change can always look
for the channel that carries it (docs/swe.md, "What remains"). The replay takes the outcome out of
that process. When a bug is verified, the calls its failing tests make into the repository are
recorded on the clean checkout (``recorder``), and each is made again by the original code, twice,
in fresh processes (``replayer``); the first time, the replayer also makes calls of its own, each
recorded call out of the shape the tests called it in (an argument moved, of another type or moved
inside; arguments passed by name; the call made again after many of the same). What the original
code answers (a digest of the value returned or the exception raised, the arguments as the call
left them, what it printed and the files it wrote, and the numbers in it apart, compared within a
tolerance: ``alike``) is kept in the task, for the calls that answered the same both times
(``Replay``). A bug must change the answer to at least one of them (where every call was recorded);
a fix must give the original's answer to every one.

The process that replays a change holds the calls but not the answers, and writes only its own
descriptions: whatever it forges there, it can only claim an answer, and an answer is judged by
comparison with one made in another process. So a fix that forges the tests' verdict, or is right
only when a test calls it or meets the inputs the tests hold, is not solved, and a bug that forges
failing tests without changing what the code does is not valid. What a change can still do: behave
one way in the replayer and another elsewhere (nothing a literal names; see docs/swe.md), and where
nothing the tests call could be recorded (arguments that do not pickle, such as generators and
lambdas), the replay has no calls and the verdict rests on the other layers, as each verdict's
``judged_by`` says.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from propel_swe import replayer

# the replayer's words for a call that ran past its time, and one during which the guard refused the change
TIMEOUT, REFUSED = replayer.TIMEOUT, replayer.REFUSED

RECORDER = (Path(__file__).parent / "recorder.py").read_bytes()
REPLAYER = (Path(__file__).parent / "replayer.py").read_bytes()
#: calls recorded in all, per test, and their pickles' bytes in all
MAX_CALLS, MAX_PER_TEST, MAX_BYTES = 60, 20, 64 << 10
VARIANTS = 4  # calls the replayer makes of its own per recorded call (one argument moved, or passed by name)
CALL_SECONDS = 5.0  # what one call may take in the replayer
NOT_REPLAYED = f'["{replayer.NOT_REPLAYED}"'  # how an answer begins where the call could not be made
UNANSWERED = (NOT_REPLAYED, TIMEOUT)  # the original code gave no answer: the call is not judged
RAISED = '[["raised"'  # how an answer begins where the call raised
RAISED_ONLY = "raised"  # the answer kept for a moved call on which the original raised: a change must raise
#: how near two numbers of an answer must be to answer the same: pytest.approx's way, with a tighter
#: relative tolerance (``math.fsum`` for ``sum`` answers the same; a float off by 1e-6 does not)
RELATIVE, ABSOLUTE = 1e-9, 1e-12
NUMBER = re.compile(r"-?(?:inf|nan|[0-9]{1,17}(?:\.[0-9]{1,17})?(?:e[-+][0-9]{1,3})?)")
INTEGER = re.compile(r"-?[0-9]+")


class Replay(BaseModel):
    """The calls a bug's failing tests make into the repository (recorded and moved), with the original
    code's answers: what a fix must answer again, outside the tests."""

    calls: list[str] = Field(
        default_factory=list, description="pickled (module, qualified name, kind, layout, arguments), base64"
    )
    shown: list[str] = Field(default_factory=list, description="each call, as a person reads it")
    answers: list[str] = Field(
        default_factory=list,
        description="digest of what the original code answered; empty: not judged; 'raised': a moved call "
        "on which the original raised, where a change must raise too",
    )
    said: list[str] = Field(default_factory=list, description="the first characters of that answer")
    numbers: list[list[str]] = Field(
        default_factory=list, description="the numbers that answer carries beside its digest, exactly (``alike``)"
    )
    paths: list[str] = Field(
        default_factory=list,
        description="folders of the checkout the tests ran with on sys.path (where classes the tests define load from)",
    )
    recorded_all: bool = Field(
        True, description="whether every call the failing tests made into the repository was recorded"
    )
    described: int = Field(
        1, description="how its answers were described (replayer.DESCRIBED); one described otherwise is not compared"
    )
    changed: int | None = Field(
        None,
        description="how many judged calls the bug's code answered otherwise than the original: 0, the bug "
        "was kept without a replay judgment (its failing tests fail under both runners and nothing the replay "
        "sees changed); None, the bug's code was not replayed",
    )
    hash_seed: int | None = Field(
        None,
        description="the string hash seed (PYTHONHASHSEED) every replay of these calls runs with, drawn per "
        "verification: what iterates in hash order answers alike in each; None: each process's own",
    )

    @property
    def judged(self) -> int:
        """How many calls a change's answers are compared on: none where the answers were described
        otherwise than the replayer describes a change's (a task verified by an older propel)."""
        if self.described != replayer.DESCRIBED:
            return 0
        return sum(bool(digest) for digest in self.answers)


def recording_orders(root: str, tests: list[str], sources: list[str], out: str) -> dict[str, Any]:
    """What the recorder is told: the checkout's root, the tests to run, the source files (absolute)
    whose calls count, where to write, and the limits."""
    return {
        "root": root,
        "tests": tests,
        "sources": [f"{root.rstrip('/')}/{path}" for path in sources],
        "out": out,
        "max_calls": MAX_CALLS,
        "max_per_test": MAX_PER_TEST,
        "max_bytes": MAX_BYTES,
    }


def answers_of(line: str) -> dict[str, Any] | None:
    """The replayer's line (without its nonce) read: ``answers`` ([digest, first characters, the
    numbers carried beside] per call) and ``made`` (the calls it made: [call, as shown, the index of
    the recorded call it follows]); None where it is not that."""
    try:
        answer = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(answer, list) or len(answer) != 2 or not isinstance(answer[0], list):
        return None
    if not all(isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) and isinstance(item[1], str)
               and numbers_in(item[2]) for item in answer[0]):  # fmt: skip
        return None
    if not isinstance(answer[1], list) or not all(
        isinstance(item, list) and len(item) == 3 and all(isinstance(part, str) for part in item)
        and item[2].isdigit() for item in answer[1]
    ):  # fmt: skip
        return None
    return {"answers": answer[0], "made": answer[1]}


def numbers_in(numbers: Any) -> bool:
    """Whether ``numbers`` is what an answer carries beside its digest: at most ``replayer.NUMBERS``
    numbers, each as Python writes an int or a float."""
    return (
        isinstance(numbers, list)
        and len(numbers) <= replayer.NUMBERS
        and all(isinstance(number, str) and NUMBER.fullmatch(number) for number in numbers)
    )


def alike(ours: list[str], theirs: list[str]) -> bool:
    """Whether two answers' numbers answer the same, as a test's ``pytest.approx`` compares them but
    tighter: an int and any number exactly (``10**15 + 1`` is not ``1e15``), two floats within
    ``RELATIVE`` of each other (or ``ABSOLUTE`` near zero), a NaN as a NaN."""
    if len(ours) != len(theirs):
        return False
    for one, other in zip(ours, theirs, strict=True):
        if INTEGER.fullmatch(one) or INTEGER.fullmatch(other):  # an int equals a number only exactly, as == says
            if exactly(one) != exactly(other):
                return False
            continue
        first, second = float(one), float(other)
        if not (math.isnan(first) and math.isnan(second)) and not math.isclose(
            first, second, rel_tol=RELATIVE, abs_tol=ABSOLUTE
        ):
            return False
    return True


def exactly(number: str) -> int | float:
    return int(number) if INTEGER.fullmatch(number) else float(number)


def in_order(recorded: list[dict], made: list[list[str]]) -> list[tuple[str, str, bool]]:
    """(call, as shown, whether the replayer made it) in the order the replayer made them: each
    recorded call, then those it made from it."""
    after: dict[int, list[tuple[str, str]]] = {}
    for call, shown, index in made:
        after.setdefault(int(index), []).append((call, shown))
    order = []
    for index, first in enumerate(recorded):
        order.append((first["call"], first["shown"], False))
        order.extend((call, f"{first['shown']} with {shown}", True) for call, shown in after.get(index, []))
    return order


def of_the_original(
    calls: list[tuple[str, str, bool]],
    first: list[list[str]],
    second: dict[str, Any] | None,
    paths: list[str],
    recorded_all: bool,
) -> Replay:
    """Every call, in order, with the original code's answer where it answered, and answered the same
    in both its replays (``first``, ``second``); an empty answer (not judged) elsewhere. Where the
    replayer made the call (inputs no test holds, ``moved``) and the original raised, the answer kept
    is ``RAISED_ONLY``: a change must raise too, whatever it raises (an input outside what the function
    takes, a float for a size, whose exception the interpreter words otherwise in a right fix built
    otherwise), and may not return. A change's replay makes every call, so each judged one meets the
    state the original's did."""
    replay = Replay(paths=paths, recorded_all=recorded_all, described=replayer.DESCRIBED)
    again = second["answers"] if second is not None else []
    for index, (call, shown, moved) in enumerate(calls):
        digest, said, numbers = first[index]
        stable = (
            index < len(again)
            and again[index][0] == digest
            and alike(again[index][2], numbers)
            and not said.startswith(UNANSWERED)
        )
        replay.calls.append(call)
        replay.shown.append(shown)
        replay.answers.append("" if not stable else RAISED_ONLY if moved and said.startswith(RAISED) else digest)
        replay.said.append(said if stable else "")
        replay.numbers.append(numbers if stable else [])
    return replay


def differing(replay: Replay, answers: list[list[str]] | None, of_a_fix: bool) -> list[int]:
    """The judged calls of ``replay`` that ``answers`` (a change's) answers otherwise than the original
    code; every judged call when no answer came. For a bug, an answer that is no answer (the call
    could not be made, or the guard refused the change something during it) does not count as
    answered otherwise: what the code does for a user is unchanged there, as far as anyone saw. For a
    fix, every other answer counts."""
    calls = [index for index, digest in enumerate(replay.answers) if digest]
    if answers is None or len(answers) != len(replay.calls):  # no answer, or not one a call
        return calls
    return [
        index
        for index in calls
        if otherwise(replay, answers[index], index)
        and (of_a_fix or not (answers[index][1] == REFUSED or answers[index][1].startswith(NOT_REPLAYED)))
    ]


def otherwise(replay: Replay, answer: list, index: int) -> bool:
    """Whether a change's ``answer`` to call ``index`` is not the original's."""
    if replay.answers[index] == RAISED_ONLY:
        return not answer[1].startswith(RAISED)
    return answer[0] != replay.answers[index] or not alike(answer[2], carried(replay, index))


def carried(replay: Replay, index: int) -> list[str]:
    """The numbers the original's answer to call ``index`` carries (none where the replay holds none)."""
    return replay.numbers[index] if index < len(replay.numbers) else []


def told(replay: Replay, answers: list[list[str]] | None, index: int) -> str:
    """One call that the change answered otherwise, as a person reads it."""
    got = answers[index][1] if answers is not None and index < len(answers) else "no answer"
    return f"{replay.shown[index]}: the original code answers {replay.said[index]}, the change {got}"
