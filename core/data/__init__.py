"""Data: the dataset contract, frame windows, samplers (uniform and episode blocks), augmentations and the
training loader."""
