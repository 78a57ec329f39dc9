"""L6: ``llamacpy serve``, an OpenAI- and llama-server-compatible HTTP server.

HTTP only: request schemas and errors (:mod:`.schemas`, :mod:`.errors`), routes
(:mod:`.routes`), SSE and disconnects (:mod:`.streaming`), response shapes
(:mod:`.responses`), API keys, CORS and body limits (:mod:`.app`), Prometheus metrics and
the chat page. Generation goes through :class:`llamacpy.api.serving.ServingModel`, whose
engine thread batches all requests (:mod:`llamacpy.engine.scheduler`).
"""

from .app import ServerConfig, ServerState, create_app
from .run import serve

__all__ = ["ServerConfig", "ServerState", "create_app", "serve"]
