"""Built-in evaluation environments."""
