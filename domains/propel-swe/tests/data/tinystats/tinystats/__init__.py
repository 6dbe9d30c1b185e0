"""A tiny statistics package: the repository the SWE domain's tests plant bugs in."""

from tinystats.core import clamp, is_sorted, mean, median, window

__all__ = ["clamp", "is_sorted", "mean", "median", "window"]
