"""A run's state on disk and in a step: checkpoint directories, what a checkpoint holds and which config
changes a resume allows, and keeping the last consistent state when a step fails or the run is stopped."""
