"""The decoding round and what it reads and records: the loop (`decoding`: plan, draft, verify, accept,
commit), the drafters, γ auto (`gamma`), the stats and the log-probabilities."""
