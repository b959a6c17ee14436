"""Generation: sampling rollouts (``rollout``), our own decode step for Llama-family decoders
(``decode``), the log-prob forward pass (``forward``) and the optional serving engines
(``engines``)."""
