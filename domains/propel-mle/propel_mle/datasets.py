"""The data sets ML tasks are made of, and each task's split into what a solution sees and what only the
verifier holds.

Two sources: scikit-learn's bundled data sets (shipped inside the scikit-learn wheel) and data sets
generated here with scikit-learn's generators. A task is a data set, a target column, a metric and a
bar; its split is fixed (by the data set and the secret), so every rollout of a task sees the same
files.
The solution's folder gets ``train.csv`` (features and target) and ``test.csv`` (an ``id`` column
and the features); the held-out target values stay in this process, and the sandbox never sees them.
Which rows are held out, their ids, and the generated data sets are drawn with a secret
(``stored_secret``): the sandbox can neither read the answers nor recompute them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: metric -> the range its verifier score lies in (rmse is scored as the skill 1 - RMSE / sd, floored at -1)
METRICS = {"accuracy": (0.0, 1.0), "f1": (0.0, 1.0), "auc": (0.0, 1.0), "rmse": (-1.0, 1.0)}
TEST_SHARE = 0.25


@dataclass(frozen=True)
class DataSet:
    name: str
    kind: str  # classification or regression
    description: str

    @property
    def metrics(self) -> tuple[str, ...]:
        if self.kind == "regression":
            return ("rmse",)
        return ("accuracy", "f1", "auc") if self.classes == 2 else ("accuracy", "f1")

    @property
    def classes(self) -> int | None:
        return int(self.frame()["target"].nunique()) if self.kind == "classification" else None

    def targets(self) -> tuple[str, ...]:
        """Columns a task may predict: the target, and for a regression data set any other column too."""
        if self.kind == "classification":
            return ("target",)
        return ("target", *(c for c in self.frame().columns if c != "target"))

    def frame(self, secret: str = ""):
        """The whole data set (a generated one drawn with ``secret``; its columns and classes are the
        same whatever the secret)."""
        return _frame(self.name, secret)


CATALOG = {
    data.name: data
    for data in (
        DataSet("iris", "classification", "150 iris flowers, 4 measurements, 3 species (scikit-learn)"),
        DataSet("wine", "classification", "178 wines, 13 chemical measurements, 3 cultivars (scikit-learn)"),
        DataSet(
            "breast_cancer",
            "classification",
            "569 tumours, 30 cell-nucleus features, benign or malignant (scikit-learn)",
        ),
        DataSet("digits", "classification", "1797 8x8 images of digits as 64 pixel columns, 10 classes (scikit-learn)"),
        DataSet(
            "diabetes",
            "regression",
            "442 patients, 10 baseline variables, disease progression after a year (scikit-learn)",
        ),
        DataSet("synthetic_classes", "classification", "800 rows, 12 features (6 informative), 2 classes, generated"),
        DataSet(
            "synthetic_regression",
            "regression",
            "600 rows, 10 features (5 informative), noisy linear target, generated",
        ),
    )
}


def data_set(name: str) -> DataSet:
    if name not in CATALOG:
        raise KeyError(f"unknown data set {name!r}; choose one of {', '.join(CATALOG)}")
    return CATALOG[name]


@functools.cache
def _frame(name: str, secret: str):
    """The whole data set as one frame with a ``target`` column (cached: every rollout reuses it)."""
    import pandas as pd
    from sklearn import datasets

    seed = _seed(name, secret) % 2**32
    if name == "synthetic_classes":
        x, y = datasets.make_classification(
            n_samples=800, n_features=12, n_informative=6, n_redundant=2, flip_y=0.05, random_state=seed
        )
    elif name == "synthetic_regression":
        x, y = datasets.make_regression(n_samples=600, n_features=10, n_informative=5, noise=25.0, random_state=seed)
    else:
        bunch = getattr(datasets, f"load_{name}")(as_frame=True)
        frame = bunch.frame.copy()
        frame.columns = [str(c).replace(" (cm)", "").replace(" ", "_") for c in frame.columns]
        return frame
    frame = pd.DataFrame(x, columns=[f"x{i}" for i in range(x.shape[1])]).round(5)
    frame["target"] = y.round(5) if name.endswith("regression") else y
    return frame


def _seed(name: str, secret: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{secret}/{name}".encode()).digest()[:8], "big")


def stored_secret(folder: Path) -> str:
    """The secret the splits and generated data sets are drawn with, kept in ``folder/secret`` (made
    once, readable by its owner only; the sandbox never sees the folder). Without it, anyone could
    recompute which rows are held out and, for a generated set, the whole set."""
    path = folder / "secret"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # another process made it first: use theirs
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_hex(16))
    for _ in range(100):  # the maker may not have written it yet
        if text := path.read_text().strip():
            return text
        time.sleep(0.01)
    raise RuntimeError(f"{path} is empty: delete it and run again")


@dataclass(frozen=True)
class Split:
    """One task's files and its held-out answers: ``train`` and ``test`` are what the solution gets,
    ``ids`` the test rows' ids in file order, ``labels`` their target values (never written out)."""

    train: Any
    test: Any
    ids: tuple[int, ...]
    labels: tuple[float, ...]
    classes: tuple[float, ...] | None


@functools.cache
def split(name: str, target: str, secret: str) -> Split:
    """The train/test split of ``name`` predicting ``target``: a permutation drawn with ``secret``, a
    quarter held out, test ids drawn at random so they say nothing of the row order. The train file
    has every column; the test file has every column but ``target``."""
    import numpy as np

    data = data_set(name)
    if target not in data.targets():
        raise KeyError(f"{name} has no column {target!r} to predict; choose one of {', '.join(data.targets())}")
    frame = data.frame(secret)
    rng = np.random.default_rng(_seed(name, secret))
    order = rng.permutation(len(frame))
    cut = math.ceil(len(frame) * TEST_SHARE)
    train = frame.iloc[order[cut:]].reset_index(drop=True)
    held_out = frame.iloc[order[:cut]].reset_index(drop=True)
    ids = rng.choice(1_000_000, size=cut, replace=False)
    test = held_out.drop(columns=[target])
    test.insert(0, "id", ids)
    classes = tuple(sorted(float(c) for c in frame[target].unique())) if data.kind == "classification" else None
    return Split(train, test, tuple(int(i) for i in ids), tuple(float(v) for v in held_out[target]), classes)


def public_files(name: str, target: str, secret: str, folder: Path) -> Path:
    """Write the files a solution of (``name``, ``target``) gets into ``folder`` (once); return it."""
    if not (folder / "test.csv").exists():
        folder.mkdir(parents=True, exist_ok=True)
        parts = split(name, target, secret)
        parts.train.to_csv(folder / "train.csv.part", index=False)
        parts.test.to_csv(folder / "test.csv.part", index=False)
        (folder / "train.csv.part").rename(folder / "train.csv")
        (folder / "test.csv.part").rename(folder / "test.csv")
    return folder
