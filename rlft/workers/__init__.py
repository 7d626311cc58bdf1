"""Worker processes for user code (reward functions, tools, ``episode.env`` environments).

Which process runs each module: ``in_worker`` runs in a worker, ``in_server`` in the worker server (the
forkserver the workers start from); the others run in the trainer.
"""
