"""Training: the loop every job kind runs inside (``loop``), the RL trainer (``trainer``), SFT,
micro-batching, checkpoints and the per-step separation statistics (``stats``)."""
