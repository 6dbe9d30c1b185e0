"""A package whose tests use each way pytest lets a test set itself up: the second runner's checks."""
