"""Parallelism: degrees and mesh, wrap units, ``parallelize`` (FSDP2, DDP, activation checkpointing,
compile) and the model it returns (``parallel_model``), the trainable-dtype rule, precision."""
