"""Data: the dataset contract and the resumable sampler."""
