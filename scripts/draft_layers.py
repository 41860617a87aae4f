"""A draft cut to its first N layers (then the final norm and the head): how much step time do
fewer layers save, and how much acceptance do they cost? An experiment, not a registry export.

    .venv/bin/python scripts/draft_layers.py --model GGUF --layers 12 --out DIR [--head-vocab 81920]
    .venv/bin/specedge bench --prompts bench/prompts.jsonl --out OUT --target qwen2.5-coder-1.5b:int4 \\
        --draft DIR --modes draft-auto
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from specedge.export import artifact
from specedge.export.settings import ExportSettings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, help="the draft's GGUF file or HF folder")
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--head-vocab", type=int, default=81920)
    args = parser.parse_args()
    load = artifact.load_source

    def first_layers(*a: object, **k: object) -> artifact.SourceModel:
        source = load(*a, **k)
        if not 0 < args.layers <= source.config.num_layers:
            raise SystemExit(f"--layers must be 1..{source.config.num_layers}")
        return dataclasses.replace(source, config=dataclasses.replace(source.config, num_layers=args.layers))

    artifact.load_source = first_layers  # the builder and the manifest read num_layers from the config
    settings = ExportSettings(quant="int4", block_size=128, attention="fused", head_vocab=args.head_vocab,
                              context=4096)
    result = artifact.export_model(Path(args.model), Path(args.out), settings)
    print(f"exported the first {args.layers} layers to {result.path}")


if __name__ == "__main__":
    main()
