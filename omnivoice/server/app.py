"""The ASGI app: routes, error handlers, request ids, and the engine's lifetime.

Everything app-wide (engine lifecycle, admission, metrics, profile) hangs off `app.state`, built in
`create_app` and started/stopped by the lifespan; nothing lives in module globals, so tests can run
several apps side by side.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from omnivoice.audio.front_door import FrontDoor
from omnivoice.config import Profile
from omnivoice.server import routes
from omnivoice.server.auth.guard import Auth
from omnivoice.server.auth.keys import ENV_VAR, ApiKeys, check_bind, is_loopback
from omnivoice.server.auth.middleware import AuthMiddleware
from omnivoice.server.auth.redact import redact_logs
from omnivoice.server.body_timeout import BodyTimeoutMiddleware
from omnivoice.server.chat.endpoint import chat_completions
from omnivoice.server.debug_state import debug_state, front_end_state, snapshot
from omnivoice.server.delivery_metrics import DeliveryCollector
from omnivoice.server.drain import Drain, DrainingServer, DrainMiddleware, in_flight
from omnivoice.server.errors import EXCEPTION_HANDLERS
from omnivoice.server.fleet.answers import answer_questions
from omnivoice.server.fleet.member import FleetMember
from omnivoice.server.fleet.messages import DebugState
from omnivoice.server.front_door_metrics import FrontDoorCollector, IntakeCollector
from omnivoice.server.lifecycle import Admission, EngineFactory, EngineLifecycle, start_default_engine
from omnivoice.server.listener import server_config
from omnivoice.server.memory_trim import MemoryTrimmer
from omnivoice.server.metrics import Metrics
from omnivoice.server.page import page_routes
from omnivoice.server.realtime.client_secrets import create_client_secret
from omnivoice.server.realtime.connection import realtime_endpoint
from omnivoice.server.session.registry import Sessions
from omnivoice.server.telephony.twilio_endpoint import twilio_endpoint
from omnivoice.server.telephony.twiml import twilio_twiml
from omnivoice.server.turn_metrics import TurnModelCollector
from omnivoice.server.webrtc import signalling
from omnivoice.server.webrtc.calls import Calls

log = logging.getLogger(__name__)
access_log = logging.getLogger("omnivoice.access")

_CLIENT_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_QUIET_PATHS = ("/health", "/metrics")  # probes and scrapes: logged at debug level


def create_app(
    profile: Profile,
    engine_factory: EngineFactory = start_default_engine,
    *,
    api_keys: ApiKeys | None = None,
    host: str | None = None,
    fleet: FleetMember | None = None,
) -> Starlette:
    """Build the app. The engine is started by the lifespan (in the background) and closed at shutdown.

    `engine_factory(profile)` must return an object with the `Engine` interface; the default is
    `omnivoice.engine.engine.Engine.start`, imported only when the app starts. `api_keys` default to
    `ApiKeys.load(profile.auth)` ($OMNIVOICE_API_KEY and auth.api_key_file; KeyConfigError if unreadable).
    `host` is the address it is served on (default server.host): a host name there is one it answers to,
    as is telephony.public_url's. `fleet`: this app is one front end of several (server/fleet/): it
    counts admission, sessions and key limits with the others and answers their questions.
    """
    keys = ApiKeys.load(profile.auth) if api_keys is None else api_keys
    drain = Drain(profile.server.drain_timeout_s)
    lifecycle = EngineLifecycle(profile, engine_factory, drain)
    tally = fleet.tally if fleet is not None else None
    admission = Admission(profile.server.max_concurrent_requests, drain, lifecycle.capacity, tally)
    own_hosts = [host or profile.server.host, urlsplit(profile.telephony.public_url or "").hostname or ""]
    auth = Auth(profile.auth, keys, own_hosts=own_hosts, tally=tally)
    # every session's input audio, batched
    front_door = FrontDoor(profile.server.audio_workers, profile.server.audio_batch_ms / 1000)
    realtime = Sessions(profile, lifecycle, admission, auth.limits, front_door=front_door, tally=tally)
    calls = Calls(realtime, connect_timeout_s=profile.realtime.webrtc_connect_timeout_s, drain=drain)

    trimmer = MemoryTrimmer(profile.server.memory_trim_interval_s)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if fleet is not None:
            answer_questions(app.state, fleet)
            fleet.answer(DebugState, lambda q: front_end_state(app.state, fleet))
            fleet.start()
        lifecycle.start()
        app.state.metrics.loop_lag.start()
        trimmer.start()
        try:
            yield
        finally:
            await trimmer.close()
            try:
                await calls.close()  # WebRTC calls are no HTTP connections: uvicorn does not end them
            finally:
                await app.state.metrics.loop_lag.stop()
                await realtime.judge.close()
                await front_door.close()
                await lifecycle.close()

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", routes.list_models, methods=["GET"]),
            Route("/v1/models/{model:path}", routes.get_model, methods=["GET"]),
            Route("/health", routes.health, methods=["GET"]),
            Route("/metrics", routes.metrics, methods=["GET"]),
            Route("/v1/debug/state", debug_state, methods=["GET"]),
            WebSocketRoute("/v1/realtime", realtime_endpoint),
            Route("/v1/telephony/twilio/twiml", twilio_twiml, methods=["GET", "POST"]),
            WebSocketRoute("/v1/telephony/twilio", twilio_endpoint),
            Route("/v1/realtime/client_secrets", create_client_secret, methods=["POST"]),
            Route("/v1/realtime/calls", signalling.create_call, methods=["POST"]),
            Route("/v1/realtime/calls/{call_id}/hangup", signalling.hang_up, methods=["POST"]),
            *page_routes(),
        ],
        middleware=[
            Middleware(RequestContextMiddleware),
            Middleware(BodyTimeoutMiddleware, timeout_s=profile.server.body_timeout_s),
            Middleware(DrainMiddleware, drain=drain),
            Middleware(AuthMiddleware, auth=auth),
        ],
        exception_handlers=EXCEPTION_HANDLERS,  # type: ignore[arg-type]
        lifespan=lifespan,
    )
    app.state.profile = profile
    app.state.memory_trimmer = trimmer
    app.state.created = int(time.time())
    app.state.lifecycle = lifecycle
    app.state.drain = drain
    app.state.admission = admission
    app.state.realtime = realtime
    app.state.webrtc = calls
    app.state.fleet = fleet
    app.state.auth = auth
    app.state.metrics = Metrics(
        in_flight=lambda: admission.in_flight,
        engine_stats=lifecycle.stats,
        server_state=lambda: snapshot(app.state),
        promised_streams=lambda: admission.streams,
    )
    app.state.metrics.registry.register(TurnModelCollector(realtime.judge.stats))
    app.state.metrics.registry.register(FrontDoorCollector(front_door))
    app.state.metrics.registry.register(IntakeCollector(realtime.intake))
    app.state.metrics.registry.register(DeliveryCollector(realtime.delivery))
    return app


async def run_server(
    profile: Profile,
    host: str,
    port: int,
    log_level: str,
    engine_factory: EngineFactory = start_default_engine,
    *,
    api_keys: ApiKeys | None = None,
    insecure_no_auth: bool = False,
    listener: socket.socket | None = None,
    fleet: FleetMember | None = None,
) -> int:
    """Serve until shut down (SIGINT/SIGTERM); 1 if the engine failed to start, else 0.

    Logs "omnivoice serving <model> on http://host:port" once the engine is up and the port bound.
    Without API keys (`api_keys`, default $OMNIVOICE_API_KEY and auth.api_key_file) it refuses a
    non-loopback `host` with UnsafeBind unless `insecure_no_auth` or auth.allow_unauthenticated_remote.
    A front end of several (`fleet`) serves the supervisor's bound `listener` and tells the supervisor
    when it serves, which logs the line once for all of them.
    """
    keys = ApiKeys.load(profile.auth) if api_keys is None else api_keys
    check_bind(host, keys, profile.auth, insecure_no_auth)
    redact_logs(keys.secrets())
    _log_auth(keys, host)
    app = create_app(profile, engine_factory, api_keys=keys, host=host, fleet=fleet)
    config = server_config(app, profile, host, port, log_level)  # timeouts, limits, proxies: listener.py
    # SIGTERM/SIGINT drain first (omnivoice.server.drain): nothing new is admitted, in-flight responses
    # get server.drain_timeout_s to finish, the rest is cancelled with a notice; then uvicorn shuts down
    server = DrainingServer(config, app.state.drain, lambda: in_flight(app.state), own_signals=fleet is None)
    if fleet is not None:
        fleet.on_stop(server.stop)  # the supervisor's signals, passed on
    sockets = [listener] if listener is not None else None
    serving = asyncio.create_task(server.serve(sockets), name="uvicorn")
    lifecycle: EngineLifecycle = app.state.lifecycle
    settled = asyncio.create_task(lifecycle.wait_settled(), name="engine-ready")
    await asyncio.wait((serving, settled), return_when=asyncio.FIRST_COMPLETED)
    while settled.done() and not server.started and not serving.done():
        await asyncio.sleep(0.01)  # the engine can be up before uvicorn has bound its socket
    ok = settled.done() and settled.result()
    if ok and server.started and fleet is not None:
        fleet.up()
    elif ok and server.started:
        bound = server.servers[0].sockets[0].getsockname()[1] if server.servers else port
        log.info("omnivoice serving %s on http://%s:%d", profile.model.served_name, host, bound)
    elif settled.done() and not ok:
        if lifecycle.state == "failed":  # else: shut down while it was starting (closed)
            log.error("engine failed to start (%s); shutting down", lifecycle.error)
        server.should_exit = True
    await serving
    settled.cancel()
    return 0 if ok or server.signals else 1  # a signal while loading is a clean stop too


def _log_auth(keys: ApiKeys, host: str) -> None:
    if keys:
        log.info("API-key auth on: %d key(s)", len(keys))
    elif is_loopback(host):
        log.warning("no API key configured: listening on loopback only (set %s to serve others)", ENV_VAR)
    else:
        log.warning("no API key configured and listening on %s: anyone who reaches it can use it", host)


class RequestContextMiddleware:
    """Gives each HTTP request an id (the client's `X-Request-Id` if sane, else a fresh one),
    echoes it in the response headers and writes one access-log line when the response ends."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        rid = given if _CLIENT_ID.fullmatch(given) else uuid.uuid4().hex[:16]
        scope.setdefault("state", {})["request_id"] = rid
        status = 0
        t0 = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [h for h in message.get("headers", []) if h[0].lower() != b"x-request-id"]
                message = {**message, "headers": [*headers, (b"x-request-id", rid.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            path = scope["path"]
            level = logging.DEBUG if path in _QUIET_PATHS and status == 200 else logging.INFO
            ms = (time.perf_counter() - t0) * 1000
            access_log.log(
                level, "request %s: %s %s -> %s in %.0f ms", rid, scope["method"], path, status, ms
            )
