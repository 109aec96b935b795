"""What operators read and steer: run queries, run views, targets, training logs (CLI, UI, API)."""
