"""The shape every wire client shares: one provider's HTTP client over the `Transport`.

Each wire module (openai_completions, openai_responses, anthropic_messages, gemini,
bedrock_converse) translates requests and parses replies its own way, but they all hold
the same things (descriptor, key, base URL, transport, the router's capabilities
callback), call the same way (build the request, POST it, parse the reply) and stream the
same way: feed events to a parser, give a failure the partial turn, always release the
connection, end with the final chunk. That part lives here, once, on the event loop
(`astream`); the blocking `stream()` is `astream` run by `providers.blocking`, and
`complete()` goes through the transport's `post_json`, itself `apost_json` run the same
way. A wire client supplies only its hooks (`_prepare`, `_parse`, `_stream_parser`, and
where its API differs, `_open_astream`, `_refine_error`, `stop_when_done`).
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import abstractmethod
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator, Mapping
from typing import Any, ClassVar, NoReturn, Protocol

from .. import blocking, errors
from ..base import ProviderClient
from ..cancel import CancelToken
from ..registry import ProviderDescriptor
from ..types import AssistantTurn, ModelCapabilities, StreamChunk

Prepared = tuple[str, dict[str, str], dict[str, Any]]
"""One call's (url, headers, JSON body)."""


class StreamParser(Protocol):
    """What `HttpProviderClient.astream` needs of a wire module's stream parser.

    A parser with a `done` attribute (set at the API's terminal event) may end the read
    early; parsers of APIs without a terminal event simply have none.
    """

    def feed(self, event: Any) -> list[StreamChunk]: ...

    def partial_turn(self) -> AssistantTurn: ...

    def finish(self) -> AssistantTurn: ...


def keep_partial(exc: errors.ProviderError, partial: AssistantTurn) -> None:
    """Give a transport failure (reset mid-stream, cancel) the text streamed so far."""
    if getattr(exc, "partial", None) is None:
        exc.partial = partial


# After a reply's terminal event, read this long for the end of the body, so that the
# connection goes back to the pool: a new session's title and a tool turn's next call
# then reuse it instead of opening another (another TCP, and TLS, handshake). A server
# that keeps the body open past it is closed on, as before.
DRAIN_SECONDS = 0.05


async def drain_iterator(events: AsyncIterable[Any]) -> None:
    """Read what is left of `events` (its end, normally) for at most DRAIN_SECONDS; the
    reply is complete already, so nothing read or raised here matters."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(DRAIN_SECONDS):
            async for _ in events:
                pass


async def aclose_iterator(events: AsyncIterable[Any]) -> None:
    """Release the connection behind a transport iterator (an async generator: `aclose()`
    runs its cleanup); iterables without `aclose` hold nothing."""
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()


class HttpProviderClient(ProviderClient):
    """A `ProviderClient` for one provider of one wire API.

    Receives BARE model names (the router strips the prefix). Owns `transport`: `close()`
    closes it. `base_url` is the profile's override or the descriptor's default, without a
    trailing slash (a subclass whose default needs filling in overrides `_resolve_base_url`).
    """

    # Streaming stops reading at the parser's terminal event (`parser.done`); an API that
    # sends more after it (Bedrock's usage `metadata`) sets this False.
    stop_when_done: ClassVar[bool] = True

    def __init__(
        self,
        descriptor: ProviderDescriptor,
        *,
        api_key: str | None,
        base_url: str | None,
        transport: Any,
        capabilities: Callable[[str], ModelCapabilities],
    ) -> None:
        self.descriptor = descriptor
        self._api_key = api_key
        self.base_url = self._resolve_base_url(base_url)
        self._transport = transport
        self._capabilities = capabilities

    def _resolve_base_url(self, base_url: str | None) -> str | None:
        return (base_url or self.descriptor.default_base_url).rstrip("/")

    def capabilities(self, model: str) -> ModelCapabilities:
        return self._capabilities(model)

    def close(self) -> None:
        self._transport.close()

    async def aclose(self) -> None:
        await self._transport.aclose()

    # --- hooks ---------------------------------------------------------------------------

    @abstractmethod
    def _prepare(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        settings: Mapping[str, Any],
        *,
        stream: bool,
    ) -> Prepared:
        """(url, headers, body) of one call. Raises before any I/O when it cannot be made
        (no key, no region): the caller gets a friendly error, the network nothing."""

    @abstractmethod
    def _parse(self, payload: dict[str, Any], *, model: str) -> AssistantTurn:
        """A whole (non-streamed) reply → AssistantTurn."""

    @abstractmethod
    def _stream_parser(self, model: str) -> StreamParser:
        """A fresh parser for one streamed reply."""

    def _open_astream(
        self,
        url: str,
        *,
        headers: dict[str, str],
        body: dict[str, Any],
        model: str,
        cancel: CancelToken | None,
    ) -> AsyncIterable[Any]:
        """The events `_stream_parser`'s parser is fed: Server-Sent Events by default."""
        return self._transport.astream_sse(
            url, headers=headers, body=body, model=model, cancel=cancel
        )

    def _refine_error(self, exc: errors.ProviderError, *, model: str) -> errors.ProviderError:
        """Re-read a failure with the API's own phrasing; the error itself by default."""
        return exc

    # --- ProviderClient --------------------------------------------------------------------

    def complete(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        **settings: Any,
    ) -> AssistantTurn:
        url, headers, body = self._prepare(model, messages, tools, settings, stream=False)
        try:
            payload = self._transport.post_json(
                url, headers=headers, body=body, model=model, cancel=settings.get("cancel")
            )
        except errors.ProviderError as exc:
            self._reraise(exc, model=model)
        return self._parse(payload, model=model)

    async def acomplete(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        **settings: Any,
    ) -> AssistantTurn:
        """`complete` on the running event loop: the same request and parser, one read of
        the whole reply instead of an event per token (a session title)."""
        url, headers, body = self._prepare(model, messages, tools, settings, stream=False)
        try:
            payload = await self._transport.apost_json(
                url, headers=headers, body=body, model=model, cancel=settings.get("cancel")
            )
        except errors.ProviderError as exc:
            self._reraise(exc, model=model)
        return self._parse(payload, model=model)

    def stream(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        **settings: Any,
    ) -> Iterator[StreamChunk]:
        """`astream`, blocking: the same request, parser and chunks, read on the private
        loop of `providers.blocking` and handed over as they come. Closing it early closes
        the upstream before `close()` returns; a `cancel` token fired from any thread
        reaches the read as it does on the engine's loop."""
        return blocking.iterate(
            self.astream(model=model, messages=messages, tools=tools, **settings)
        )

    async def astream(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        **settings: Any,
    ) -> AsyncIterator[StreamChunk]:
        """Stream one reply on the running event loop (the engine's path, read without a
        thread): the parser's deltas, then one chunk with the turn.

        Reading stops at the parser's terminal event (`parser.done`) when
        `stop_when_done`, after draining the end of the body for a moment so the
        connection can go back to the pool. A `ProviderError` on the way keeps the partial
        turn and propagates; the event iterator is closed whatever happens, so a consumer
        that stops early (Stop, a crash) never leaves the upstream socket open. `finish()`
        judges a stream that ended without its terminal event. One generator, not one
        per step: each layer is a hop for every event of every turn.
        """
        url, headers, body = self._prepare(model, messages, tools, settings, stream=True)
        parser = self._stream_parser(model)
        events = self._open_astream(
            url, headers=headers, body=body, model=model, cancel=settings.get("cancel")
        )
        try:
            try:
                async for event in events:
                    for chunk in parser.feed(event):
                        yield chunk
                    if self.stop_when_done and getattr(parser, "done", False):
                        await drain_iterator(events)
                        break
            except errors.ProviderError as exc:
                keep_partial(exc, parser.partial_turn())
                raise
            finally:
                await aclose_iterator(events)
            turn = parser.finish()
        except errors.ProviderError as exc:
            self._reraise(exc, model=model)
        yield StreamChunk(turn=turn)

    def _reraise(self, exc: errors.ProviderError, *, model: str) -> NoReturn:
        refined = self._refine_error(exc, model=model)
        if refined is exc:
            raise exc
        raise refined from None
