"""The plugin registry: hook specifications, discovery, typed lookups (torch-free)."""
