"""Math problem generation as a propel domain."""
