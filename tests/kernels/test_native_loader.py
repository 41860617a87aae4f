"""The native library's loader says in one line why the op cannot run: an ONNX Runtime older than
the C API it registers against would register nothing, silently."""

from __future__ import annotations

import importlib.metadata

import pytest

from specedge.kernels import native


@pytest.mark.parametrize(("version", "old"), [("1.20.1", True), ("1.21.0", False), ("1.32.0", False),
                                              ("2.0.0.dev1", False)])
def test_an_onnxruntime_older_than_the_op_needs_is_named(monkeypatch: pytest.MonkeyPatch, version: str,
                                                         old: bool) -> None:
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda d: version if d == "onnxruntime" else real(d))
    why = native.runtime_too_old()
    assert bool(why) == old
    if old:
        assert why == ("onnxruntime 1.20.1 is older than 1.21, whose C API the native 4-bit kernel needs "
                       "(pip install -U 'onnxruntime>=1.21')")
