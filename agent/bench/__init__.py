"""Benchmarks of planners against toyworld's ground truth."""
