"""The swe domain on a real project: six 1.17.0, fetched from its PyPI sdist, in the local sandbox."""

import json

from propel_core.records import Context


def test_preflight_keeps_six(six_domain):
    baseline = six_domain.baseline(six_domain.repos["six"])
    assert baseline.keep, baseline.reasons
    assert baseline.test_count > 150 and baseline.failures == 0
    assert baseline.imported_files == ["six.py"]  # what the procedural generator may mutate


def test_procedural_bugs_on_six_are_verified_and_a_revert_solves_one(six_domain):
    context = Context(id="six", data={"repo": "six"})
    valid = None
    reasons = []
    for seed in range(24):  # six is mostly Python 2 paths: few mutations break a test
        payload = six_domain.parse(six_domain.episode(context, None, seed=seed))
        validity = six_domain.verify(payload)
        reasons.append(validity.reason)
        if validity.valid:
            valid = payload
            break
    assert valid is not None, reasons
    assert valid["failing_tests"] and all(test.startswith("test_six") for test in valid["failing_tests"])

    revert = f"```bash\ncat > /tmp/bug.diff <<'PATCH'\n{valid['diff']}PATCH\ngit apply -R /tmp/bug.diff\n```"
    replies = iter([revert, "```submit\n```"])
    attempt = six_domain.solver_episode(valid, lambda messages: next(replies))
    assert json.loads(attempt)["turns"][0]["output"].startswith("exit code 0")
    verdict = six_domain.grade(valid, attempt)
    assert verdict.solved is True, verdict.reason
