"""noisymlt: noisy multi-label long-tailed recognition benchmark pipeline."""

__version__ = "0.1.0"
