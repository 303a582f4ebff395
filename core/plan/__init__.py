"""Planning a run before it runs: per-rank memory of parameters, gradients, optimizer state and traced activations, and the largest batch that fits."""
