"""``rlft rm``: train a Bradley-Terry reward model on preference pairs and export it as a Hugging Face
sequence-classification directory. data.py (pairs), model.py (the scored model, export), train.py
(the loop), state.py (checkpoints), command.py (the Hydra app and ``rlft export`` of its checkpoints)."""
