"""Where a run's output goes: the console, metrics.jsonl, the run log (train.log), plots, wandb."""
