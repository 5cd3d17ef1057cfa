"""Where alert webhooks may go: the egress allow-list, address checks and URL redaction.

A webhook URL is a request to make the notifier connect somewhere, so it is checked like
one (the cloud metadata address, Consul on loopback and the pod network are the usual
targets of such a request):

* its host must match an entry of the allow-list (setting ``alerts.webhook_egress``;
  default empty: no webhook is allowed) — a host name (``hooks.example.com``), a suffix
  wildcard (``*.example.com``), or an address or network (``10.0.0.5``, ``10.0.0.0/8``,
  ``::1``); an entry may pin a port (``hooks.example.com:443``);
* every address the host resolves to must be global (not private, loopback, link-local,
  shared, reserved, multicast or unspecified; an IPv6 form standing for an IPv4 address —
  IPv4-mapped, 6to4, NAT64 ``64:ff9b::/96``, IPv4-translated, IPv4-compatible — judged by
  that IPv4 address; NAT64 local-use ``64:ff9b:1::/48`` never global) unless
  it lies in an allow-listed network: an internal receiver is allowed by naming its
  address, never by its name alone;
* the relay connects to an address it checked (:func:`resolve`, then the connection is
  made to that address with the URL's host for ``Host`` and TLS), so a DNS answer that
  changes between the check and the connection cannot redirect it; and it follows no
  redirect.

:class:`EgressPolicy` and :func:`redact` are pure; :func:`resolve` does the DNS lookup.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
DEFAULT_PORTS = {"http": 80, "https": 443}
REDACTED = "/…"


class EgressRefused(ValueError):
    """A webhook target the notifier may not connect to; the message says why."""


@dataclass(frozen=True)
class Target:
    """A checked webhook URL: where to connect and what to ask for."""

    scheme: str
    host: str  # as in the URL (a name, or an address without brackets)
    port: int
    path: str  # path and query, for the request line

    @property
    def is_tls(self) -> bool:
        return self.scheme == "https"


@dataclass(frozen=True)
class _Entry:
    host: str = ""  # a name, or "*.suffix"; empty for a network entry
    network: Network | None = None
    port: int | None = None

    def allows_address(self, address: Address, port: int) -> bool:
        """Whether this entry allow-lists connecting to ``address`` on ``port`` even though
        it is not global: it names a network holding it (and the port, if it pins one)."""
        if self.network is None or (self.port is not None and self.port != port):
            return False
        return _unwrap(address) in self.network or address in self.network

    def matches(self, host: str, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.network is not None:
            address = _address(host)
            return address is not None and (
                _unwrap(address) in self.network or address in self.network
            )
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and len(host) > len(self.host) - 1
        return host == self.host


def _address(text: str) -> Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


# IPv6 forms that carry an IPv4 address in their low 32 bits (issue 37, finding 10): the
# NAT64 well-known prefix (RFC 6052: a NAT64 gateway connects to that IPv4 address), the
# IPv4-translated SIIT form (RFC 2765) and the deprecated IPv4-compatible form (RFC 4291).
_EMBEDS_IPV4_LOW = (
    ipaddress.IPv6Network("64:ff9b::/96"),
    ipaddress.IPv6Network("::ffff:0:0:0/96"),
    ipaddress.IPv6Network("::/96"),
)
# NAT64 local-use prefixes (RFC 8215): where the IPv4 address sits depends on the site's
# prefix length, and the gateway is the site's own; never global.
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")


def _unwrap(address: Address) -> Address:
    """The IPv4 address an IPv6 address stands for (IPv4-mapped ``::ffff:a.b.c.d``, 6to4,
    NAT64 ``64:ff9b::a.b.c.d``, IPv4-translated, IPv4-compatible ``::a.b.c.d``); the
    address itself otherwise."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.sixtofour is not None:
            return address.sixtofour
        if int(address) > 1 and any(address in net for net in _EMBEDS_IPV4_LOW):
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def _is_public(address: Address) -> bool:
    """Whether a connection to ``address`` reaches the internet only: global, not
    multicast, and for IPv6 neither a NAT64 local-use nor a reserved (unallocated) one;
    an address standing for an IPv4 address is judged by that address."""
    if address in _NAT64_LOCAL:
        return False
    plain = _unwrap(address)
    if isinstance(plain, ipaddress.IPv6Address) and plain.is_reserved:
        return False
    return plain.is_global and not plain.is_multicast and not address.is_multicast


def _parse_entry(text: str) -> _Entry:
    entry = text.strip().lower()
    if not entry:
        raise ValueError("an egress entry must not be empty")
    port: int | None = None
    host = entry
    if entry.startswith("["):  # [v6]:port
        host, _, rest = entry[1:].partition("]")
        if rest:
            port = _port(rest.removeprefix(":"), text)
    elif entry.count(":") == 1:  # name:port or v4:port (a bare v6 has more colons)
        host, _, port_text = entry.partition(":")
        port = _port(port_text, text)
    try:
        network = ipaddress.ip_network(host, strict=False)
    except ValueError:
        network = None
    if network is not None:
        return _Entry(network=network, port=port)
    label = host.removeprefix("*.")
    if not label or not all(part and part.replace("-", "").isalnum() for part in label.split(".")):
        raise ValueError(f"egress entry {text!r}: not a host name, *.suffix or address/network")
    return _Entry(host=host, port=port)


def _port(text: str, entry: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) < 65536:
        raise ValueError(f"egress entry {entry!r}: bad port {text!r}")
    return int(text)


class EgressPolicy:
    """The webhook egress allow-list (pure). Empty: every webhook is refused."""

    def __init__(self, entries: Iterable[str] = ()) -> None:
        self.entries = tuple(_parse_entry(e) for e in entries)

    def target(self, url: str) -> Target:
        """The URL's target if its host is allow-listed; :class:`EgressRefused` otherwise
        (also for a URL that is not http(s) or has credentials in it)."""
        parts = urlsplit(url)
        if parts.scheme not in DEFAULT_PORTS:
            raise EgressRefused("must be an http:// or https:// URL")
        try:
            host, port = parts.hostname, parts.port
        except ValueError as exc:
            raise EgressRefused(f"has a bad port ({exc})") from None
        if not host:
            raise EgressRefused("has no host")
        if parts.username is not None or parts.password is not None:
            raise EgressRefused("must not carry credentials before the host")
        port = port or DEFAULT_PORTS[parts.scheme]
        if not any(e.matches(host, port) for e in self.entries):
            raise EgressRefused(
                f"host {host}:{port} is not in the webhook egress allow-list "
                "(notifier setting alerts.webhook_egress)"
            )
        path = parts.path or "/"
        if parts.query:
            path = f"{path}?{parts.query}"
        return Target(parts.scheme, host, port, path)

    def check_addresses(self, target: Target, addresses: Sequence[str]) -> list[str]:
        """The addresses of ``target`` the relay may connect to: all of them, or
        :class:`EgressRefused` if any is not global and not in an allow-listed network
        (one bad answer taints the name: DNS may hand either out next)."""
        if not addresses:
            raise EgressRefused(f"{target.host} resolves to no address")
        for text in addresses:
            address = _address(text)
            if address is None:
                raise EgressRefused(f"{target.host} resolves to {text!r}, not an address")
            if _is_public(address):
                continue
            if not any(e.allows_address(address, target.port) for e in self.entries):
                raise EgressRefused(
                    f"{target.host} resolves to {text}, a private, loopback, link-local or "
                    "reserved address that is not allow-listed by address"
                )
        return list(addresses)


def resolve(target: Target) -> list[str]:
    """Every address ``target.host`` resolves to now, in the resolver's order (blocking).
    An address literal resolves to itself."""
    if _address(target.host) is not None:
        return [target.host]
    # socket.gaierror (an OSError) when it does not resolve: maybe for now only.
    infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    seen: dict[str, None] = {}
    for _family, _type, _proto, _name, sockaddr in infos:
        seen.setdefault(str(sockaddr[0]).split("%")[0], None)
    return list(seen)


def redact(url: str) -> str:
    """A webhook URL fit for a list answer or a log line: scheme, host and port only (the
    path, query and credentials often are the secret)."""
    parts = urlsplit(url)
    try:
        host, port = parts.hostname or "", parts.port
    except ValueError:
        host, port = parts.hostname or "", None
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port else host
    if not parts.scheme and not netloc:
        return REDACTED
    tail = REDACTED if (parts.path not in ("", "/") or parts.query or parts.username) else ""
    return f"{parts.scheme}://{netloc}{tail}"


def is_redacted(url: str) -> bool:
    """A URL as :func:`redact` gives it back: never a target to store."""
    return urlsplit(url).path == REDACTED
