"""Machine-learning engineering (seed 002) as a propel domain."""
