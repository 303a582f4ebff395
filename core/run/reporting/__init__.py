"""What a run tells its user: the start-up banner, log lines and the progress bar,
``logs/metrics.jsonl``, experiment tracking, per-member mixture figures and MFU.

Nothing here changes training; the loop hands it numbers and it writes them.
"""
