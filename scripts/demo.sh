#!/usr/bin/env bash
# Export SmolLM2-135M-Instruct (fp32 target, int4 draft) from its PyPI package and decode with both.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
GGUF=$($PY -c "from specedge.models.registry import locate_packaged_file as f; print(f('smollm2-135m'))")
ART=$($PY - "$GGUF" <<'PYEOF'
import sys
from pathlib import Path
from specedge.export.cache import cached_export
from specedge.export.settings import ExportSettings
for quant in ("fp32", "int4"):
    print(cached_export(Path(sys.argv[1]), ExportSettings(quant=quant, context=1024), name="smollm2-135m"))
PYEOF
)
TARGET=$(echo "$ART" | sed -n 1p)
DRAFT=$(echo "$ART" | sed -n 2p)
PROMPT="Write a Python function that checks whether a string is a palindrome."
echo "== plain decoding of the fp32 target"
.venv/bin/specedge generate --target "$TARGET" --no-draft --chat --prompt "$PROMPT"
echo "== speculative: int4 draft, gamma 4 (same tokens, fewer target passes)"
.venv/bin/specedge generate --target "$TARGET" --draft "$DRAFT" --gamma 4 --chat --prompt "$PROMPT"
