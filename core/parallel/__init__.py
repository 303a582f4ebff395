"""Parallelism: degrees and mesh, wrap units, the parallelize pipeline (FSDP2, DDP, activation checkpointing, compile), precision."""
