"""The check of each weight sync: the sampler must score a fixed probe as the learner does, and serve the
learner's weights (the sync itself is each sampler's ``sync_weights``)."""
