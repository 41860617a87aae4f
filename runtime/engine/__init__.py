"""One model's passes: its manifest checked and session opened (`session`, `graphs`, `graph_facts`,
`weight_pages`, `kernel_probe`), the feeds and runners of a pass, the KV cache, row groups and every
padding of a pass (`rows`, `row_groups`), and the bytes a pass moves (`traffic`)."""
