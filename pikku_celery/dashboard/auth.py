"""HTTP Basic sign-in for every page and API document, and CSRF tokens for the action forms.

With a password, runs' input, output, errors and state are only shown to a
signed-in browser or client; without one nothing can sign in and the
dashboard is open and read-only.

Browsers resend Basic credentials on any request to the site, including a form
another site posts, so every action form also carries a token: an HMAC, under
a key of this process, of a random nonce kept in a cookie. Another site can
neither read the cookie nor compute the token.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["CSRF_COOKIE", "CSRF_FIELD", "SIGN_IN", "DashboardAuth", "RequireSignIn"]

CSRF_COOKIE: Final = "pikku_csrf"
CSRF_FIELD: Final = "csrf_token"
REALM: Final = "pikku-celery dashboard"
SIGN_IN: Final = (
    "Sign in to see this dashboard: HTTP Basic auth with any user name and the dashboard "
    "password (PIKKU_DASHBOARD_PASSWORD). A browser asks for it; with curl, pass "
    "-u any:PASSWORD.\n"
)


class DashboardAuth:
    """Checks the dashboard password; without one, nothing can sign in and actions are off."""

    def __init__(self, password: str | None, *, secret: bytes | None = None) -> None:
        self._password = password.encode("utf-8") if password else None
        # A restart invalidates open forms, which a reload fixes; nothing to configure.
        self._secret = secret or secrets.token_bytes(32)

    @property
    def enabled(self) -> bool:
        return self._password is not None

    def signed_in(self, request: Request) -> bool:
        """True when the request carries Basic credentials with the password (any user name)."""
        if self._password is None:
            return False
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(value.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        _user, colon, given = decoded.partition(b":")
        return bool(colon) and hmac.compare_digest(given, self._password)

    def challenge(self, body: str) -> Response:
        return Response(
            body,
            status_code=401,
            media_type="text/plain",
            headers={"WWW-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"'},
        )

    def token_for(self, nonce: str) -> str:
        return hmac.new(self._secret, nonce.encode("utf-8"), hashlib.sha256).hexdigest()

    def form_token(self, request: Request) -> tuple[str, str | None]:
        """The token for this browser's forms, and a new nonce to set as cookie if it has none."""
        nonce = request.cookies.get(CSRF_COOKIE)
        if nonce:
            return self.token_for(nonce), None
        nonce = secrets.token_urlsafe(32)
        return self.token_for(nonce), nonce

    def set_nonce(self, request: Request, response: Response, nonce: str) -> None:
        response.set_cookie(
            CSRF_COOKIE,
            nonce,
            httponly=True,
            samesite="lax",
            secure=request.url.scheme == "https",
            path="/",
        )

    def csrf_ok(self, request: Request, submitted: str) -> bool:
        nonce = request.cookies.get(CSRF_COOKIE)
        if not nonce or not submitted or not _same_origin(request):
            return False
        return hmac.compare_digest(submitted.encode("utf-8"), self.token_for(nonce).encode("utf-8"))


class RequireSignIn:
    """Answers 401 to every request not signed in, when a password is set.

    Wraps all the routes that show runs, so a route added later is behind the
    password unless it is put outside on purpose.
    """

    def __init__(self, app: ASGIApp, auth: DashboardAuth) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.auth.enabled:
            if not self.auth.signed_in(Request(scope)):
                await self.auth.challenge(SIGN_IN)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _same_origin(request: Request) -> bool:
    """The browser's own word on where the form came from, when it gives one.

    Sec-Fetch-Site is set by the browser relative to the page, so it holds
    behind a reverse proxy, where comparing Origin with Host would not.
    """
    return request.headers.get("sec-fetch-site", "same-origin") in ("same-origin", "none")
