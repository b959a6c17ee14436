"""ConSPO's objectives and statistics inside other training frameworks (optional extras).

``conspo.integrations.trl``: ``ConSPOTrainer``, TRL's ``GRPOTrainer`` training with any objective
of ``conspo.registry`` (``pip install 'conspo-lab[trl]'``).
"""
