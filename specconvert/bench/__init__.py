"""Benchmarking: load generator, metric arithmetic, reports and plots (``specconvert bench``)."""
