"""Distributed training: the collectives a rank calls (``collectives``). Starting the ranks (local
processes, a Ray cluster) is ``conspo.launch``'s."""
