"""Host side, stdlib only: the ASGI middleware that makes vLLM's API key guard every route.

Why: vLLM's own key check covers the /v1, /v2, /inference and /cohere prefixes only, so POST /invocations
(always registered) runs a completion without the key and /scale_elastic_ep answers too. vLLM loads this
class through its own `--middleware` option, after its other middleware, so it is the outermost layer:
nothing reaches a route, a mount or a websocket without the key unless its exact path is open.

Installed on hosts alone in its own directory (HOST_TOOLS/asgi/vllm_fleet_keyguard.py, on the unit's
PYTHONPATH), so that directory makes nothing else importable. The plan adds it only to instances that
have a key; with the middleware but no key it refuses to start rather than run open.

routes() lists every route the installed vLLM registers for a config (built as `vllm serve` builds its
app, without an engine; /openapi.json lacks websockets, mounts and routes out of the schema): the host
validator (validate_serve.py) writes that list, and the smoke test probes each route without the key.
`python vllm_fleet_keyguard.py routes CONFIG.yaml` prints it, with the release's own interpreter.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_ENV = "VLLM_FLEET_OPEN_PATHS"  # comma-separated exact paths answered without the key
DEFAULT_OPEN = ("/health",)
KEY_ENV = "VLLM_API_KEY"
_BODY = b'{"error":"Unauthorized"}'


def open_paths(environ: MutableMapping[str, str] | None = None) -> frozenset[str]:
    env = os.environ if environ is None else environ
    raw = env.get(OPEN_ENV)
    items = DEFAULT_OPEN if raw is None else tuple(p.strip() for p in raw.split(","))
    return frozenset(p for p in items if p)


def route_path(scope: Scope) -> str:
    """The path the router matches: Starlette strips root_path the same way (get_route_path), so the open
    decision is made on exactly what a route sees."""
    path: str = scope.get("path", "")
    root = scope.get("root_path", "")
    if root and path.startswith(root) and (path == root or path[len(root)] == "/"):
        return path[len(root):]
    return path


def _header(scope: Scope, name: bytes) -> bytes | None:
    for k, v in scope.get("headers", ()):
        if k.lower() == name:
            return v
    return None


class KeyGuard:
    """Pure ASGI: exact open paths pass; everything else needs `Authorization: Bearer <VLLM_API_KEY>`.

    A CORS preflight (OPTIONS with Origin and Access-Control-Request-Method) passes without the key:
    browsers never send credentials on it, and vLLM's CORSMiddleware, always installed inside this one,
    answers every preflight itself before any route runs.
    """

    def __init__(self, app: App) -> None:
        key = os.environ.get(KEY_ENV, "")
        if not key:
            raise RuntimeError(f"vllm_fleet_keyguard: {KEY_ENV} is not set; refusing to serve unguarded")
        self.app = app
        self._digest = hashlib.sha256(key.encode()).digest()
        self.open = open_paths()

    def allowed(self, scope: Scope) -> bool:
        if route_path(scope) in self.open:
            return True
        if (scope["type"] == "http" and scope.get("method") == "OPTIONS"
                and _header(scope, b"origin") is not None
                and _header(scope, b"access-control-request-method") is not None):
            return True
        value = _header(scope, b"authorization")
        if value is None:
            return False
        scheme, _, token = value.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(hashlib.sha256(token.encode("latin-1")).digest(), self._digest)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.allowed(scope):
            await self.app(scope, receive, send)
            return
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(_BODY)).encode()),
                   (b"www-authenticate", b"Bearer")]
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": _BODY})
        elif "websocket.http.response" in scope.get("extensions", {}):
            await send({"type": "websocket.http.response.start", "status": 401, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": _BODY})
        else:  # a close before accept: the server refuses the handshake (403)
            await send({"type": "websocket.close", "code": 1008})


def _all_tasks() -> tuple[str, ...]:
    import typing

    from vllm import tasks

    # nested Literals come out flat
    return tuple(dict.fromkeys(a for a in typing.get_args(tasks.SupportedTask) if isinstance(a, str)))


def routes(config: str) -> list[dict[str, Any]]:
    """Every route vLLM's app registers for this config, for every task it supports (the union: the
    smoke test then covers whatever the model turns out to serve). Building the app starts no engine."""
    import contextlib
    import importlib
    import io
    import warnings

    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.launchers.app import build_app
    except ImportError:  # older layouts
        from vllm.entrypoints.openai.api_server import build_app

    # the app builds its middleware stack (this class included) while bootstrapping; it never serves here
    os.environ.setdefault(KEY_ENV, "route-listing")
    parser = FlexibleArgumentParser(prog="vllm")
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subcommand"))
    ns = parser.parse_args(["serve", "--config", config])
    found: dict[tuple[str, str], set[str]] = {}
    for task in _all_tasks():
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                app = build_app(ns, supported_tasks=(task,))
        except Exception:  # noqa: BLE001  a task whose optional dependencies this release lacks
            if task == "generate":  # every generating instance has these routes: no list without them
                raise
            continue
        for r in app.routes:
            _add(found, r)
    # pooling routers are registered only with the model's config, which needs the engine: read them
    for name in ("pooling", "classify", "embed", "scoring"):
        with contextlib.suppress(Exception):
            module = importlib.import_module(f"vllm.entrypoints.pooling.{name}.api_router")
            for r in module.router.routes:
                _add(found, r)
    return [{"kind": k, "path": p, "methods": sorted(m)} for (k, p), m in sorted(found.items())]


def _add(found: dict[tuple[str, str], set[str]], r: Any) -> None:
    from starlette.routing import Mount, WebSocketRoute

    path = getattr(r, "path", None)
    if path is None:
        return
    kind = "websocket" if isinstance(r, WebSocketRoute) else "mount" if isinstance(r, Mount) else "http"
    found.setdefault((kind, path), set()).update(getattr(r, "methods", None) or ())


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "routes":
        print("usage: vllm_fleet_keyguard.py routes CONFIG.yaml", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(json.dumps(routes(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
