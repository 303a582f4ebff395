"""Parallelism: degrees and mesh, the parallelize pipeline, precision, the memory plan."""
