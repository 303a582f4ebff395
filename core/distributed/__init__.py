"""Processes: launcher contract, process-group start-up, the Accelerate environment guard."""
