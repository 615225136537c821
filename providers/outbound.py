"""The SSRF guard: every base URL is user-settable, so every outbound request is checked.

A URL passes when it is plain http(s) without userinfo, its host is a DNS name or a
canonical IP literal, and EVERY address the name resolves to is public (or named by the
admin allow-list, or loopback in embedded mode). `GuardedTransport` then connects to the
very address that was checked, so a DNS answer that changes between check and connect
(DNS rebinding) cannot redirect the request; the Host header and TLS SNI/certificate
check still use the original name.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import os
import re
import socket
import ssl
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

from .aio_backend import AsyncioBackend
from .errors import OutboundBlockedError, UpstreamUnavailableError

ALLOWLIST_ENV = "OPENWORKER_OUTBOUND_ALLOWLIST"
ALLOWED_SCHEMES = ("http", "https")
DEFAULT_PORTS = {"http": 80, "https": 443}

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]

# Cloud instance-metadata endpoints: AWS/GCP/Azure/OCI (v4 and AWS's v6), Alibaba, Azure's
# wireserver. Named so the refusal says why, and refused even when a host name is listed.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200", "168.63.129.16")
)
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_IPV4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_TEREDO = ipaddress.ip_network("2001::/32")
_SITE_LOCAL = ipaddress.ip_network("fec0::/10")

_HOST_LABEL = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$")
# Labels an IPv4 parser (inet_aton, WHATWG) would read as a number: decimal, octal, hex.
_NUMERIC_LABEL = re.compile(r"^(?:0x[0-9a-f]*|[0-9]+)$")
_CANONICAL_OCTET = re.compile(r"^(?:0|[1-9][0-9]{0,2})$")


@dataclass(frozen=True)
class ResolvedTarget:
    scheme: str
    host: str
    port: int
    addresses: list[str]


def system_resolver(host: str, port: int) -> list[str]:
    """Every address `host` resolves to, in the resolver's order, without duplicates."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: dict[str, None] = {}
    for info in infos:
        seen.setdefault(str(info[4][0]), None)
    return list(seen)


def _parse_allowlist(entries: Iterable[str]) -> tuple[frozenset[str], tuple[IPNetwork, ...]]:
    hosts: set[str] = set()
    networks: list[IPNetwork] = []
    for entry in entries:
        item = entry.strip().lower()
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item.strip("[]"), strict=False))
            continue
        except ValueError:
            pass
        name = item.rstrip(".")
        if not all(_HOST_LABEL.match(label) for label in name.split(".")):
            raise ValueError(f"outbound allow-list entry is not a host, IP or CIDR: {entry!r}")
        hosts.add(name)
    return frozenset(hosts), tuple(networks)


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 transition form carries, if it is one."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _IPV4_TRANSLATED or ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return ip.sixtofour
    return None


def forbidden_reason(ip: IPAddress) -> str | None:
    """Why `ip` must not be reached from the server, or None when it is public."""
    if ip in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id:
            return "an IPv6 address with a zone id"
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            reason = forbidden_reason(embedded)
            return f"an IPv6 form of {embedded}, {reason}" if reason else None
        if ip in _NAT64_LOCAL or ip in _TEREDO:
            return "a tunnelled IPv6 address"
        if ip in _IPV4_COMPATIBLE and not ip.is_unspecified and not ip.is_loopback:
            return "a deprecated IPv4-compatible IPv6 address"
        if ip in _SITE_LOCAL:
            return "a site-local address"
    checks = (
        (ip.is_unspecified, "an unspecified address"),
        (ip.is_loopback, "a loopback address"),
        (ip.is_link_local, "a link-local address"),
        (ip.is_multicast, "a multicast address"),
        (isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT, "a shared (CGNAT) address"),
        (ip.is_private, "a private address"),
        (ip.is_reserved, "a reserved address"),
        (not ip.is_global, "not a public address"),
    )
    for hit, reason in checks:
        if hit:
            return reason
    return None


def _is_loopback(ip: IPAddress) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


class OutboundPolicy:
    """Which hosts the server may call. Allow-list entries are host names, IPs or CIDRs."""

    def __init__(
        self,
        allowlist: Iterable[str] = (),
        allow_loopback: bool = False,
        *,
        resolver: Resolver | None = None,
    ) -> None:
        self.allowed_hosts, self.allowed_networks = _parse_allowlist(allowlist)
        self.allow_loopback = allow_loopback
        self._resolve = resolver or system_resolver

    @classmethod
    def from_env(
        cls,
        embedded: bool,
        *,
        environ: Mapping[str, str] | None = None,
        resolver: Resolver | None = None,
    ) -> OutboundPolicy:
        """Embedded mode admits loopback (a local Ollama just works); distributed mode admits
        nothing private unless `OPENWORKER_OUTBOUND_ALLOWLIST` (comma separated) lists it."""
        env = os.environ if environ is None else environ
        entries = [e for e in env.get(ALLOWLIST_ENV, "").split(",") if e.strip()]
        return cls(entries, allow_loopback=embedded, resolver=resolver)

    def check_url(self, url: str | httpx.URL) -> ResolvedTarget:
        """Parse, resolve and vet `url`; raise `OutboundBlockedError` with the reason."""
        parsed = self._parse(url)
        scheme = parsed.scheme
        host = parsed.raw_host.decode("ascii").lower()
        port = parsed.port or DEFAULT_PORTS[scheme]
        literal = _literal_address(host)
        addresses = [literal] if literal is not None else self._resolve_host(host, port)
        name = host.rstrip(".")
        for text in addresses:
            self._check_address(name, text)
        return ResolvedTarget(scheme=scheme, host=host, port=port, addresses=addresses)

    def _parse(self, url: str | httpx.URL) -> httpx.URL:
        if isinstance(url, str):
            if "\\" in url:
                raise OutboundBlockedError("backslashes are not allowed in a URL")
            if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
                raise OutboundBlockedError("whitespace or control characters in the URL")
            try:
                url = httpx.URL(url)
            except (httpx.InvalidURL, ValueError, TypeError) as exc:
                raise OutboundBlockedError(f"not a valid URL: {exc}") from None
        if url.scheme not in ALLOWED_SCHEMES:
            raise OutboundBlockedError(f"only http and https are allowed, not {url.scheme!r}")
        if url.userinfo:
            raise OutboundBlockedError("credentials in the URL (user@host) are not allowed")
        if not url.raw_host:
            raise OutboundBlockedError("the URL has no host")
        return url

    def _resolve_host(self, host: str, port: int) -> list[str]:
        name = host.rstrip(".")
        labels = name.split(".")
        if all(_NUMERIC_LABEL.match(label) for label in labels) or _NUMERIC_LABEL.match(labels[-1]):
            raise OutboundBlockedError(
                f"host {host!r} is a numeric address in a non-canonical spelling"
            )
        if not all(_HOST_LABEL.match(label) for label in labels) or len(name) > 253:
            raise OutboundBlockedError(f"host {host!r} is not a valid host name")
        try:
            addresses = [str(a) for a in self._resolve(name, port)]
        except OSError as exc:
            raise UpstreamUnavailableError(f"could not resolve host {name!r}: {exc}") from None
        if not addresses:
            raise UpstreamUnavailableError(f"host {name!r} resolved to no address")
        return list(dict.fromkeys(addresses))

    def _check_address(self, host: str, text: str) -> None:
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            raise OutboundBlockedError(f"host {host!r} resolved to an unusable address") from None
        candidates = [ip]
        if isinstance(ip, ipaddress.IPv6Address) and _embedded_ipv4(ip) is not None:
            candidates.append(_embedded_ipv4(ip))  # type: ignore[arg-type]
        if any(c in net for c in candidates for net in self.allowed_networks):
            return
        reason = forbidden_reason(ip)
        if reason is None:
            return
        if self.allow_loopback and _is_loopback(ip):
            return
        if host in self.allowed_hosts and "metadata" not in reason:
            return
        shown = host if host == text else f"{host!r} ({text})"
        raise OutboundBlockedError(
            f"{shown} is {reason}; an admin can allow it with {ALLOWLIST_ENV}"
        )


def _literal_address(host: str) -> str | None:
    """The canonical IP literal `host` is, or None for a name. Non-canonical numeric
    spellings (2130706433, 0177.0.0.1, 0x7f.1) are refused by the name check later."""
    if ":" in host:
        if "%" in host:
            raise OutboundBlockedError("IPv6 zone ids are not allowed")
        try:
            return str(ipaddress.IPv6Address(host))
        except ValueError:
            raise OutboundBlockedError(f"{host!r} is not a valid IPv6 address") from None
    name = host[:-1] if host.endswith(".") else host
    octets = name.split(".")
    if len(octets) == 4 and all(_CANONICAL_OCTET.match(o) and int(o) <= 255 for o in octets):
        return name
    return None


@functools.cache
def default_ssl_context() -> ssl.SSLContext:
    """One verifying client context per process, shared by every transport.

    Building a context loads the CA bundle: tens of milliseconds of CPU under the GIL.
    A router per turn built one per provider client, which at a few hundred concurrent
    turns stalled every other thread (seen in a py-spy profile of bench/stream_path.py).
    A client-side SSLContext is safe to share between threads.
    """
    return httpx.create_ssl_context(verify=True, trust_env=False)


class GuardedTransport(httpx.HTTPTransport):
    """An httpx transport that checks every request and connects to the checked address.

    The request URL's host is swapped for the vetted IP; the Host header keeps the original
    name and `sni_hostname` keeps TLS SNI and certificate verification on it. Proxies are
    refused: through a proxy the address actually reached could not be pinned.
    Used by the `fetch_url` tool; the provider transport uses `AsyncGuardedTransport`.
    `network_backend` lets a caller observe the sockets (the tests do).
    """

    def __init__(
        self,
        policy: OutboundPolicy,
        *,
        verify: Any = True,
        cert: Any = None,
        trust_env: bool = False,
        http1: bool = True,
        http2: bool = False,
        limits: httpx.Limits | None = None,
        local_address: str | None = None,
        retries: int = 0,
        socket_options: Any = None,
        network_backend: httpcore.NetworkBackend | None = None,
    ) -> None:
        # HTTPTransport.__init__ only builds `_pool`; it is built here instead so that the
        # network backend can be set and no proxy path exists.
        self._policy = policy
        limits = limits or httpx.Limits(max_connections=100, max_keepalive_connections=20)
        if verify is True and cert is None and not trust_env:
            ssl_context = default_ssl_context()
        else:
            ssl_context = httpx.create_ssl_context(verify=verify, cert=cert, trust_env=trust_env)
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            http1=http1,
            http2=http2,
            local_address=local_address,
            retries=retries,
            socket_options=socket_options,
            network_backend=network_backend,
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        target = self._policy.check_url(request.url)
        last_error: httpx.ConnectError | None = None
        for pinned in _pinned_requests(request, target):
            try:
                return super().handle_request(pinned)
            except httpx.ConnectError as exc:
                # Nothing was sent: the next vetted address of the same name may answer.
                last_error = exc
        assert last_error is not None
        raise last_error


class AsyncGuardedTransport(httpx.AsyncHTTPTransport):
    """`GuardedTransport` for `httpx.AsyncClient`: the same check (its DNS lookup in a
    thread, off the event loop) and the same pinning, over asyncio sockets."""

    def __init__(
        self,
        policy: OutboundPolicy,
        *,
        limits: httpx.Limits | None = None,
        shared_pool: Any = None,
    ) -> None:
        """`shared_pool`: connections kept beyond this transport (the engine loop's
        `kept_connections.KeptConnections`), which its `aclose` leaves open."""
        self._policy = policy
        self._shared_pool = shared_pool
        if shared_pool is not None:
            self._pool = shared_pool
            return
        limits = limits or httpx.Limits(max_connections=100, max_keepalive_connections=20)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=default_ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            http1=True,
            http2=False,
            network_backend=AsyncioBackend(),
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if _literal_address(request.url.raw_host.decode("ascii").lower()) is not None:
            target = self._policy.check_url(request.url)  # an address: no lookup to wait for
        else:
            target = await asyncio.to_thread(self._policy.check_url, request.url)
        last_error: httpx.ConnectError | None = None
        for pinned in _pinned_requests(request, target):
            try:
                return await super().handle_async_request(pinned)
            except httpx.ConnectError as exc:
                last_error = exc
        assert last_error is not None
        raise last_error

    async def aclose(self) -> None:
        if self._shared_pool is None:
            await super().aclose()


def _pinned_requests(request: httpx.Request, target: Any) -> Iterator[httpx.Request]:
    """`request` aimed at each vetted address of its host in turn: the Host header keeps
    the name, and TLS keeps SNI and certificate checks on it."""
    extensions = dict(request.extensions)
    if target.scheme == "https":
        extensions["sni_hostname"] = target.host.rstrip(".")
    if target.addresses == [request.url.host]:
        # Already aimed at its one vetted address (a URL of an IP literal): the same
        # request, not a copy with its URL parsed again.
        request.extensions = extensions
        yield request
        return
    for address in target.addresses:
        yield httpx.Request(
            request.method,
            request.url.copy_with(host=address),
            headers=request.headers,
            stream=request.stream,
            extensions=extensions,
        )
