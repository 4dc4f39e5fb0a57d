"""What the benchmarks share: databases, the broker, workers, CPU accounting and reports.

One module per concept, so a benchmark script imports the pieces it uses and
keeps only what it measures.
"""
