"""One training run: its spec, assembly, the loop, logging, tracking, publishing."""
