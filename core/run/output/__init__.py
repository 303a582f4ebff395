"""The run's output folder: which folder it is, whether it can be written, the lock that gives it
one writer, and a failed write during training stopping every rank at one step.

Decided before anything is built (``choose_folder``, ``writable``, ``lock``), so a refusal costs no
model or dataset.
"""
