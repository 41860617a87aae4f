"""The QNN tests run Qualcomm's own toolchain: onnxruntime-qnn's HTP backend, which on x86_64 is the
Hexagon compiler and simulator. They skip, saying why, where its wheel is not installed."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def htp() -> None:
    from specedge.runtime import qnn

    if qnn.plugin() is None:
        pytest.skip("onnxruntime-qnn is not installed (wheels: Windows ARM64/x64, Linux x86_64, Python >= 3.11); "
                    "pip install 'specedge[qnn]'")
    if not qnn.available():
        pytest.skip("onnxruntime-qnn is installed but its plugin library did not register with this onnxruntime")
