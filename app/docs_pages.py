"""The API docs pages (/docs: Swagger UI, /redoc: ReDoc) stay on this server: their assets
are served by the app (fastapi-offline), and a Content-Security-Policy keeps the browser from
fetching anything from another host, such as the logo ReDoc's bundle loads from
cdn.redoc.ly (it hides itself when refused). So the docs work, and look the same, offline."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

DOCS_PATHS = ("/docs", "/docs/oauth2-redirect", "/redoc")
# Inline scripts and styles: the pages' own start-up script and the styles both UIs inject;
# blob: workers: ReDoc's search index. Nothing else but this origin.
DOCS_POLICY = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; "
    "frame-ancestors 'self'; base-uri 'self'; form-action 'self'"
)


class DocsPolicy:
    """Adds DOCS_POLICY to the answers of the docs pages."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in DOCS_PATHS:
            await self.app(scope, receive, send)
            return

        async def send_with_policy(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), (b"content-security-policy", DOCS_POLICY.encode())]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_policy)
