"""Models: the store of built-in and uploaded checkpoints (``store``), the catalogue of what each
built-in is (``catalog``), numeric precision, the memory estimate (``resources``), lineage,
export, the built-in chat model's warm start (``tiny_chat``) and the pretrained SmolLM2 built
from an installed package (``smollm2``)."""
