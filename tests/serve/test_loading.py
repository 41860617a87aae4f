"""The server while its models load: the port answers at once, /health 503 "loading" and every other
path the error object `model_loading`, until the models are ready; a model that cannot load stops
the server with one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from starlette.testclient import TestClient

from specedge.runtime import Generator, SpecConfig
from specedge.serve.app import ServeSettings, create_app
from specedge.serve.guard import Origins, RequestGuard
from specedge.serve.loading import LoadingGate
from specedge.serve.protocol import SHUTTING_DOWN
from tests.serve.conftest import HERE, free_port

ORIGINS = Origins.of_listener("127.0.0.1", 8000)


def test_loading_then_ready(tiny_llama: tuple[Path, Path, Path]) -> None:
    gate = LoadingGate()
    with TestClient(RequestGuard(gate, ORIGINS), base_url=HERE) as client:
        health = client.get("/health")
        assert (health.status_code, health.json()) == (503, {"status": "loading"})
        models = client.get("/v1/models")
        assert models.status_code == 503 and models.json()["error"]["code"] == "model_loading"
        assert models.headers["retry-after"] == "5"
        assert client.get("/health", headers={"host": "evil.example"}).status_code == 421  # guarded meanwhile
        gen = Generator.load(tiny_llama[1], single_steps=True, config=SpecConfig(gamma=0))
        assert gate.open(create_app(gen, ServeSettings(model_id="tiny", origins=ORIGINS)))
        assert client.get("/health").json()["status"] == "ok"
        r = client.post("/v1/completions", json={"model": "tiny", "prompt": "ab", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    assert not gate.app.state.server.worker.running  # the lifespan's shutdown stopped the worker


def test_models_ready_after_the_stop_are_not_started(tiny_llama: tuple[Path, Path, Path]) -> None:
    gate = LoadingGate()
    gate.end_all(SHUTTING_DOWN)  # Ctrl-C while loading
    gen = Generator.load(tiny_llama[1], single_steps=True, config=SpecConfig(gamma=0))
    app = create_app(gen, ServeSettings(model_id="tiny", origins=ORIGINS))
    assert not gate.open(app) and gate.app is None and not app.state.server.worker.running


def test_a_model_that_cannot_load_stops_the_server_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "specedge", "serve", "--target", str(tmp_path / "absent"),
                           "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "loading the model" in proc.stderr


def test_ctrl_c_while_the_model_loads_stops_at_once(smollm2_gguf: Path, tmp_path: Path) -> None:
    """A first run exporting its model (SmolLM2's GGUF into an empty cache) is stopped by Ctrl-C
    without waiting for the export: one line, exit 0, no traceback."""
    import os
    import signal

    env = {**os.environ, "SPECEDGE_CACHE": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "specedge", "serve", "--target", str(smollm2_gguf), "--port",
                             str(free_port())], stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # the export has begun: its first line
        seen.append(line)
        if "exporting" in line:
            break
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=60)[1]
    assert proc.returncode == 0, "".join(seen) + rest
    assert "stopped while the model was loading" in rest and "Traceback" not in rest
