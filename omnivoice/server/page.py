"""The browser voice-chat page: `web/` of the source tree (plain HTML/JS/CSS, no build step), served
at `/` (index.html) and `/web/*`. An installed wheel has no `web/`: then there is no page."""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

WEB_DIR = Path(__file__).resolve().parents[2] / "web"


def page_routes(web_dir: Path = WEB_DIR) -> list[BaseRoute]:
    """Routes for the page, or none when `web_dir` has no index.html."""
    if not (web_dir / "index.html").is_file():
        return []

    async def index(request: Request) -> FileResponse:
        return FileResponse(web_dir / "index.html", headers={"Cache-Control": "no-cache"})

    return [
        Route("/", index, methods=["GET"]),
        Mount("/web", StaticFiles(directory=web_dir), name="web"),
    ]
