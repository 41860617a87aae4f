"""`specedge serve` on the command line, without a model: the server stack stays out of the core,
a missing extra and a port in use are one-line errors."""

from __future__ import annotations

import socket
import subprocess
import sys

from tests.test_cli import assert_one_line_error


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_core_and_cli_do_not_import_the_server_stack() -> None:
    proc = python("import sys, specedge.runtime.generator, specedge.cli\n"
                  "specedge.cli.build_parser().parse_args(['serve', '--target', 'x'])\n"
                  "print([m for m in ('starlette', 'uvicorn', 'anyio', 'httpx') if m in sys.modules])")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_missing_serve_extra_says_how_to_install() -> None:
    proc = python("import sys; sys.modules['uvicorn'] = None\n"
                  "from specedge.cli import main; sys.exit(main(['serve', '--target', 'x']))")
    assert proc.returncode == 2
    assert_one_line_error(proc, "uvicorn", "pip install 'specedge[serve]'")


def test_port_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = python(f"import sys; from specedge.cli import main; "
                      f"sys.exit(main(['serve', '--target', 'x', '--port', '{port}']))")
    assert proc.returncode == 2
    assert_one_line_error(proc, f"cannot listen on 127.0.0.1:{port}", "--port")


def test_port_out_of_range_is_one_line() -> None:
    for port in ("70000", "65536"):
        proc = python(f"import sys; from specedge.cli import main; "
                      f"sys.exit(main(['serve', '--target', 'x', '--port', '{port}']))")
        assert proc.returncode == 2
        assert_one_line_error(proc, f"--port {port}", "65535")
