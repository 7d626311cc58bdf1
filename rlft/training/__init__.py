"""The training step and what it is built from: the loop (sample -> score -> learn -> sync -> log -> save), the
components it runs with, rollout collection, the batch, log-probs, the update, held-out evaluation."""
