"""Multi-turn episodes: the policy replies, an environment (tools, or the user's) answers, the policy
continues; the trajectory is kept as the exact token ids the sampler produced and conditioned on."""
