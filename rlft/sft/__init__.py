"""``rlft sft``: supervised fine-tuning on demonstrations, rendered as ``rlft train`` renders the same
conversations, so the model RL starts from has learnt the exact tokens RL samples and trains on."""
