"""Parallelism: degrees and mesh, wrap units, ``parallelize`` (FSDP2, DDP, activation checkpointing,
compile), the trainable-dtype rule, precision."""
