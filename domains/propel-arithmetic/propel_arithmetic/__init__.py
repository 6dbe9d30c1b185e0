"""Arithmetic exercises ("Compute: 23 + 48") as a propel domain."""
