"""The chat template of a model, code from its publisher: rendered in a bounded sandbox (sandbox.py),
what each call and operator would build sized before it runs (bounds.py)."""
