"""AZR code induction as a propel domain."""
