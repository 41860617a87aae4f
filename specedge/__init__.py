"""specedge: lossless speculative decoding for small language models on ONNX Runtime.

    import specedge

    model = specedge.load("qwen2.5-coder")
    print(model.chat([{"role": "user", "content": "Reverse a string in Python."}]).text)

The public names are `__all__`'s (specedge/api.py); they load the runtime on first use, so
importing specedge (or building the CLI) loads no ONNX Runtime.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# ONNX Runtime's official builds (>= 1.29 on Linux and macOS) send usage telemetry and write a device id
# under ~/.cache/Microsoft unless told not to before the library is first imported; every entry point
# (the CLI, the server, `import specedge`, every subpackage) imports this package first. docs/security.md
TELEMETRY_OFF = ("ORT_DISABLE_TELEMETRY", "ORT_TELEMETRY_DISABLED")  # the name 1.29-1.32 read, and the later one
for _name in TELEMETRY_OFF:
    os.environ.setdefault(_name, "1")

__version__ = "0.2.0"
__all__ = ["Grammar", "Model", "Reply", "SpecEdgeError", "ToolCall", "__version__", "load"]

if TYPE_CHECKING:
    from specedge.api import Model, Reply, load
    from specedge.core.errors import SpecEdgeError
    from specedge.runtime.constraints.grammar import Grammar
    from specedge.runtime.text.tools import ToolCall

_HOMES = {"load": "specedge.api", "Model": "specedge.api", "Reply": "specedge.api",
          "Grammar": "specedge.runtime.constraints.grammar", "ToolCall": "specedge.runtime.text.tools",
          "SpecEdgeError": "specedge.core.errors"}


def __getattr__(name: str) -> Any:  # PEP 562: the runtime loads when a public name is first used
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'specedge' has no attribute {name!r}")
