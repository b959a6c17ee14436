"""Distributed training: the collectives a rank calls (``collectives``), the process launcher
(``launch``) and multi-node runs on Ray (``ray_train``)."""
