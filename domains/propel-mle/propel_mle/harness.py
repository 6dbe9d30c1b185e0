"""Runs inside the sandbox, around a solution: records what the solution actually does.

``python harness.py SOLUTION MARKERS`` installs an audit hook (which no Python code can remove) and a
profile hook, then runs SOLUTION as ``__main__``. Each workflow marker is appended to the file
MARKERS the first time the run reaches it, so a run that crashes or is killed keeps what it reached:

- ``imports``: a numerical or ML package (numpy, pandas, scipy, scikit-learn) was imported;
- ``data loaded``: ``train.csv`` was opened for reading;
- ``model defined``: an object with ``fit`` and ``predict`` (or ``transform``) methods was constructed;
- ``fit``: a ``fit``-like method ran; ``predict``: a ``predict``-like method ran.

The submission markers are not recorded here: the verifier sees the submission file itself, outside.
Standard library only, and nothing imported after the hooks are in place, so every import the
audit hook sees is the solution's.
"""

import os
import runpy
import sys
import threading
import traceback

PACKAGES = frozenset({"numpy", "pandas", "scipy", "sklearn"})
FITS = frozenset({"fit", "fit_transform", "fit_predict", "partial_fit"})
PREDICTS = frozenset({"predict", "predict_proba", "predict_log_proba", "decision_function"})


def main(solution, markers_path):
    reached = set()
    out = open(markers_path, "a", buffering=1)  # noqa: SIM115 - open for the whole run

    def mark(name):
        if name not in reached:
            reached.add(name)
            out.write(name + "\n")
            out.flush()

    def audit(event, args):
        try:
            if event == "import" and args[0].partition(".")[0] in PACKAGES:
                mark("imports")
            elif event == "open" and isinstance(args[0], (str, bytes)):
                path, mode, flags = args
                name = os.path.basename(os.fsdecode(path))
                reading = ("r" in mode or "+" in mode) if isinstance(mode, str) else flags & 3 != os.O_WRONLY
                if name == "train.csv" and reading:
                    mark("data loaded")
        except Exception:  # a hook that raises would fail the solution's own call
            pass

    def profile(frame, event, arg):
        if event != "call":
            return
        name = frame.f_code.co_name
        if name not in FITS and name not in PREDICTS and name != "__init__":
            return
        owner = type(frame.f_locals.get("self"))
        if not hasattr(owner, "fit"):
            return
        if name == "__init__":
            if hasattr(owner, "predict") or hasattr(owner, "transform"):
                mark("model defined")
        else:
            mark("fit" if name in FITS else "predict")
        if {"model defined", "fit", "predict"} <= reached:  # nothing left to watch for: stop paying for it
            sys.setprofile(None)
            threading.setprofile(None)

    sys.addaudithook(audit)
    threading.setprofile(profile)
    sys.setprofile(profile)
    sys.argv = [solution]
    try:
        runpy.run_path(solution, run_name="__main__")
    except SystemExit:
        raise
    except BaseException:
        sys.setprofile(None)
        traceback.print_exc()
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
