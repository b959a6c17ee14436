"""ConSPO Lab backend: settings, schema, REST API, live streams (docs/api.md is the contract)."""
