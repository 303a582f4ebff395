"""Typed run configuration: the pydantic schema and the flag parser (torch-free)."""
