"""Temporary: the in-memory reader this package replaced, kept only until the equality test has passed against it."""
