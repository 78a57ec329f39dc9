"""OpenAI's Responses API (``/v1/responses``) on the chat path: ``POST`` answers a Response
(whole, or as the API's stream events), ``GET /v1/responses/{id}`` returns a kept one,
``DELETE`` forgets it. Responses are kept in memory for ``previous_response_id``
(:class:`~llamacpy.api.responses_api.ResponseStore`: at most 1000, least recently used
first out) unless the request says ``"store": false``."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..api import responses_api as rapi
from ..api.serving import Final
from ..errors import LlamacpyError
from .errors import APIError, bad_request
from .responses import EventShaper, Shaper, event
from .routes import _completion, _state, read_json


def _store(request: Request) -> rapi.ResponseStore:
    st = _state(request)
    if st.responses_store is None:
        st.responses_store = rapi.ResponseStore()
    return st.responses_store


class ResponsesShaper(EventShaper):
    """One completion as a Response, or as its stream events; the finished Response is
    kept in ``store`` with the conversation it ends."""

    def __init__(self, model: str, data: dict[str, Any], conv: list, store: Any, **kw: Any):
        super().__init__("chat", model, **kw)
        self.id = rapi.new_id("resp")
        self.data, self.conv, self.store = data, conv, store
        self.events = rapi.ResponseEvents(self.id)

    def _response(self, final: Final | None, output: list, calls: bool = False) -> dict:
        if final is None:
            return rapi.response(self.id, self.data, self.model, output, "in_progress", None)
        status = "incomplete" if final.finish_reason == "length" and not calls else "completed"
        usage = {"prompt": final.n_prompt, "cached": final.n_cached,
                 "completion": final.n_predicted}  # fmt: skip
        resp = rapi.response(self.id, self.data, self.model, output, status, usage)
        if self.data.get("store", True) is not False:
            self.store.put(resp, rapi.history_of(self.conv, output))
        return resp

    def result(self, finals: Final | list[Final]) -> Any:
        final = finals if isinstance(finals, Final) else finals[0]
        msg = self._chat_choice(final)["message"]
        status = "incomplete" if final.finish_reason == "length" else "completed"
        output = rapi.output_items(msg, status)
        return self._response(final, output, bool(msg.get("tool_calls")))

    def first(self) -> list[bytes]:
        return [event(*e) for e in self.events.start(self._response(None, []))]

    def done(self, final: Final) -> list[bytes]:
        out, reply = self.finish(final)
        out += self.events.close()
        resp = self._response(final, self.events.items, bool(reply.tool_calls))
        return [event(*e) for e in [*out, *self.events.end(resp)]]

    def error(self, err: Any) -> bytes:
        return event("error", {"type": "error", "code": err.type, "message": err.message,
                               "param": None, "sequence_number": self.events.seq})  # fmt: skip


async def create(request: Request) -> Response:
    """``POST /v1/responses``."""
    data = await read_json(request)
    store = _store(request)
    history: list = []
    prev = data.get("previous_response_id")
    if prev is not None:
        kept = store.get(prev) if isinstance(prev, str) else None
        if kept is None:
            raise APIError(400, f"Previous response with id '{prev}' not found.",
                           param="previous_response_id")  # fmt: skip
        history = kept[1]
    try:
        conv = rapi.conversation(data, history)
        body = rapi.chat_request(data, conv)
    except LlamacpyError as e:
        raise bad_request(str(e)) from None

    def make(kind: str, model: str, plan: Any) -> Shaper:
        return ResponsesShaper(model, data, conv, store, plan=plan)

    return await _completion(request, "chat", body, make)


async def retrieve(request: Request) -> Response:
    """``GET /v1/responses/{id}``."""
    kept = _store(request).get(request.path_params["response_id"])
    if kept is None:
        raise APIError(404, f"Response with id '{request.path_params['response_id']}' not "
                       "found.")  # fmt: skip
    return JSONResponse(kept[0])


async def delete(request: Request) -> Response:
    """``DELETE /v1/responses/{id}``."""
    rid = request.path_params["response_id"]
    if not _store(request).delete(rid):
        raise APIError(404, f"Response with id '{rid}' not found.")
    return JSONResponse({"id": rid, "object": "response.deleted", "deleted": True})


ROUTES = [
    Route("/v1/responses", create, methods=["POST"]),
    Route("/responses", create, methods=["POST"]),
    Route("/v1/responses/{response_id}", retrieve, methods=["GET"]),
    Route("/v1/responses/{response_id}", delete, methods=["DELETE"]),
]
