"""Fine-tuning task data."""
