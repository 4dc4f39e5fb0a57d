"""Benchmarks of pikku-celery, each run on its own (never a timed test); see README.md."""
