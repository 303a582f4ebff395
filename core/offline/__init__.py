"""Offline checkpoint tools (convert, inspect) and the torch-free readers they share."""
