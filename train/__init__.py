"""Training: data loading, losses and the head-training loop."""
