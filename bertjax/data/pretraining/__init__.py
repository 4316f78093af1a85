"""Pre-training data."""
