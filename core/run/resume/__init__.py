"""Continuing a run from a checkpoint: which checkpoint it continues from, which changed flags a
resume accepts, the optimizer's hyperparameters taken from the flags, and ``--resume_from``
dropping later steps.

The checkpoint code restores state; what a resume may change is the run's decision, kept here.
"""
