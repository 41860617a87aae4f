"""The chat page at `/`: static files inside the package (no CDN, no build step: it works offline),
served with a content security policy that lets them talk to this server only. The page streams
answers from /v1/chat/completions with `{"specedge": {"show_draft": true}}`, renders them as
Markdown with highlighted code blocks and a copy button (markdown.js and highlight.js, written for
it: no dependencies), colours each character by where its token came from, and shows tokens/s,
acceptance, tokens per target pass and bytes per token as they come. Conversations (a list: new,
switch, delete) and the sampling settings are kept in the browser's localStorage."""

from __future__ import annotations

from importlib import resources

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

FILES = {"index.html": "text/html; charset=utf-8", "chat.js": "text/javascript; charset=utf-8",
         "markdown.js": "text/javascript; charset=utf-8", "highlight.js": "text/javascript; charset=utf-8",
         "chat.css": "text/css; charset=utf-8"}
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
# path -> file: what a browser may load without the API key, and while the models load
PAGE_PATHS = {"/": "index.html", **{f"/page/{name}": name for name in FILES}}


def page_response(path: str) -> Response | None:
    """The page's file at `path` (None: no file of the page's)."""
    name = PAGE_PATHS.get(path)
    if name is None:
        return None
    body = resources.files("specedge.serve").joinpath("page", name).read_bytes()
    return Response(body, media_type=FILES[name], headers=PAGE_HEADERS)


async def page_file(request: Request) -> Response:
    response = page_response(request.url.path)
    if response is None:
        raise HTTPException(404)
    return response


def page_routes() -> list[Route]:
    return [Route("/", page_file, methods=["GET"]), Route("/page/{name}", page_file, methods=["GET"])]
