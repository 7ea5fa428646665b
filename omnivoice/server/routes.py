"""Small read-only endpoints: `/health`, `/v1/models`, `/metrics`."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from omnivoice.server.errors import not_found
from omnivoice.server.fleet.answers import fleet_metrics


async def health(request: Request) -> Response:
    """200 `{"status": "ok"}` once the engine is up (with `graphs_pending` per stage while CUDA graphs
    of wide batches are still being captured after the start, and `narrowed_to`, the requests it
    serves at once, when its start found GPU memory for no wider batch: `Engine.narrow`); 503 while
    it is starting (with `progress`: the steps of the start so far and what remains,
    engine/start_progress.py), failed, draining (shutting down) or closed."""
    lifecycle = request.app.state.lifecycle
    if request.app.state.drain.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    failure = lifecycle.engine.failure if lifecycle.state == "ready" else None
    if lifecycle.state == "ready" and not failure:
        # CUDA graphs of wide batches still to be captured after the start (runners/graph_backlog.py)
        pending: dict[str, int] = {}
        for worker in lifecycle.engine.replica_stats():  # the workers' last figures: no capacity fit
            if worker.graphs_pending:
                pending[worker.name] = pending.get(worker.name, 0) + worker.graphs_pending
        body: dict[str, object] = {"status": "ok"}
        if pending:
            body["graphs_pending"] = pending
        narrowed = lifecycle.engine.narrowed
        if narrowed is not None:
            body["narrowed_to"] = narrowed
        return JSONResponse(body)
    restarting = bool(failure) and lifecycle.engine.restarting
    body = {"status": "restarting" if restarting else "failed" if failure else lifecycle.state}
    if lifecycle.state == "starting":
        body["progress"] = lifecycle.progress.snapshot()
    if failure:
        body["error"] = failure
    if lifecycle.error:
        body["error"] = lifecycle.error
    return JSONResponse(body, status_code=503)


def _model_card(request: Request) -> dict:
    state = request.app.state
    return {
        "id": state.profile.model.served_name,
        "object": "model",
        "created": state.created,
        "owned_by": "omnivoice",
    }


async def list_models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [_model_card(request)]})


async def get_model(request: Request) -> Response:
    card = _model_card(request)
    name = request.path_params["model"]
    if name != card["id"]:
        raise not_found(f"the model {name!r} does not exist", param="model", code="model_not_found")
    return JSONResponse(card)


async def metrics(request: Request) -> Response:
    fleet = request.app.state.fleet
    if fleet is not None:  # one front end of several: the whole server's
        return Response(await fleet_metrics(request.app.state, fleet), media_type=CONTENT_TYPE_LATEST)
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
