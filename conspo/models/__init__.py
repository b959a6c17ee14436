"""Models: the store of built-in and uploaded checkpoints (``store``), the catalogue of what each
built-in is (``catalog``), numeric precision, the memory estimate (``resources``), lineage,
export, and the built-in chat model's warm start (``tiny_chat``)."""
