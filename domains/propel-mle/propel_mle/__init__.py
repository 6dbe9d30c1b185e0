"""Machine-learning engineering (the ML-engineering RL study) as a propel domain."""
