"""Plugin hooks, the plugin manager and the built-in plugins."""
