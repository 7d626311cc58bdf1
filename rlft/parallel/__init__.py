"""Data parallelism: the process group, FSDP2 sharding, ``trainer.nproc=N``'s launcher and its pre-flight."""
