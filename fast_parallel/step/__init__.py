"""The training step made cheaper with the same bytes (batched targets)."""
