"""ConSPO Lab: the platform around the ``conspo`` training library (CLI, client, TRL bridge)."""
