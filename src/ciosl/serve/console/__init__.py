"""The console: a page served at ``/`` by ``ciosl serve`` for the people who teach a learner
(sign in, learners, teach, ask, watch). Plain HTML, CSS and JavaScript shipped in this package:
no build step, nothing fetched from elsewhere. The static files hold no data, so they need no
token; every call the page makes to ``/v1`` sends the token as a bearer header."""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

# the page may load and connect to nothing but its own server; no inline script or style
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
       "media-src 'self' blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
       "frame-ancestors 'none'")
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8"}
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}


def files() -> dict[str, bytes]:
    """The console's files by name (read once: a fixed set, never a path from a request)."""
    folder = resources.files(__name__)
    return {p.name: p.read_bytes() for p in folder.iterdir()
            if p.is_file() and p.name[p.name.rfind("."):] in TYPES}


def _answer(name: str, body: bytes) -> Response:
    return Response(body, media_type=TYPES[name[name.rfind("."):]], headers=HEADERS)


def console_routes() -> list[Route]:
    """``GET /`` (the page) and ``GET /console/<file>`` (its scripts and style sheet)."""
    shipped = files()

    async def page(request: Request) -> Response:
        return _answer("index.html", shipped["index.html"])

    async def static(request: Request) -> Response:
        name = request.path_params["file"]
        if name not in shipped:
            return JSONResponse({"error": f"no console file {name[:80]!r}"}, status_code=404,
                                headers=HEADERS)
        return _answer(name, shipped[name])

    return [Route("/", page, methods=["GET"]),
            Route("/console/{file}", static, methods=["GET"])]
