"""The math-verify worker: reads JSON requests on stdin, answers one JSON line each on stdout.

math-verify's parsers can hang and use ``eval`` on model-written text, so they never run in the main
process: ``propel_math.verify.Verifier`` starts this module as a separate, restartable process with
a timeout per request.
"""

import json
import sys


def main() -> None:
    from math_verify import parse, verify

    sys.stdout.write(json.dumps({"ready": True}) + "\n")  # start-up is over: requests get their own budget
    sys.stdout.flush()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            gold = parse(request["gold"], parsing_timeout=None)
            answer = parse(request["answer"], parsing_timeout=None)
            reply = {"equal": bool(gold and answer and verify(gold, answer, timeout_seconds=None))}
        except Exception as exc:  # a parse failure is an unequal answer, reported with its type
            reply = {"equal": False, "error": type(exc).__name__}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
