"""Training targets for a whole batch at once, equal to stock per sample."""
