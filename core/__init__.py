"""The foundations every layer of specedge stands on: the graph contract, the manifest schema,
weight costs, errors, a progress bar. Standard library only (and numpy nowhere): nothing here imports
another folder of specedge."""
