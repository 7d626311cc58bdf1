"""The commands besides ``rlft check`` and ``rlft rm`` (their own packages): ``rlft train`` as a Hydra
application, its ``--help``, a job's status file, ``rlft export``."""
