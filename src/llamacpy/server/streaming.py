"""From the engine thread to the client: a per-request event channel, an SSE response that
notices a disconnected client at once, and a wait for a whole result that does too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ..api.serving import Chunk, Failure, Final
from . import accesslog


class Channel:
    """Events of one request, pushed by the engine thread, read by the event loop.

    ``chunks=False`` keeps only the final event (whole, non-streamed responses)."""

    def __init__(self, chunks: bool = True) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.chunks = chunks

    def emit(self, ev: Any) -> None:  # engine thread: must not block
        if not self.chunks and isinstance(ev, Chunk):
            return
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, ev)
        except RuntimeError:
            pass  # the event loop is gone (shutdown): nobody is listening

    async def get(self) -> Any:
        return await self.queue.get()

    async def finals(self, count: int = 1) -> list[Final | Failure]:
        """The final events of ``count`` completions (stops early at a failure)."""
        out: list[Final | Failure] = []
        while len(out) < count:
            ev = await self.queue.get()
            if isinstance(ev, Final | Failure):
                out.append(ev)
                if isinstance(ev, Failure):
                    break
        return out


async def wait_disconnect(receive: Receive) -> None:
    """Return when the client has gone (the request body must have been read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class ClientGone(Exception):
    pass


async def result_or_disconnect(
    channel: Channel, receive: Receive, on_disconnect: Callable[[], None], count: int = 1
) -> list[Final | Failure]:
    """The final events of the request's ``count`` completions; if the client disconnects
    first, ``on_disconnect()`` is called and :class:`ClientGone` raised."""
    watch = asyncio.ensure_future(wait_disconnect(receive))
    get = asyncio.ensure_future(channel.finals(count))
    try:
        done, _ = await asyncio.wait({watch, get}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        watch.cancel()
        get.cancel()
        on_disconnect()
        raise
    if get in done:
        watch.cancel()
        return get.result()
    get.cancel()
    on_disconnect()
    raise ClientGone


class EventStream(StreamingResponse):
    """``text/event-stream`` that listens for the client's disconnect while streaming
    (whatever the ASGI server's spec version) and then calls ``on_disconnect``."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], on_disconnect: Callable[[], None]) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_disconnect = on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = False
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                try:
                    await self.stream_response(send)
                except OSError:
                    pass
                finally:
                    tg.cancel_scope.cancel()

            tg.start_soon(run)
            await wait_disconnect(receive)
            gone = True
            tg.cancel_scope.cancel()
        if gone:
            accesslog.note(scope, disconnected=True)
            self.on_disconnect()
