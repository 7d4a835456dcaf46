"""A pool's name as replica addresses: its A and AAAA records, from the system resolver
(/etc/resolv.conf, /etc/hosts) or from the nameservers `discovery.nameservers` names (dnspython).
A name with no records (a headless Service scaled to zero) is no addresses, not an error; a
resolver that does not answer is `ResolveFailed`."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING

from router.config.sections import nameserver_address

if TYPE_CHECKING:
    import dns.asyncresolver

# dnspython is imported by a resolver that names its nameservers, and only then: it costs a
# process ~0.15 s of CPU at start, and most gateways list their replicas or ask the system.


class ResolveFailed(Exception):
    """No answer either way: the resolver is unreachable, timed out or failed."""


class Resolver:
    def __init__(self, nameservers: Sequence[str], timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._dns: dns.asyncresolver.Resolver | None = None
        if nameservers:
            import dns.asyncresolver  # noqa: PLC0415

            resolver = dns.asyncresolver.Resolver(configure=False)
            pairs = [nameserver_address(server) for server in nameservers]
            resolver.nameservers = [host for host, _ in pairs]
            resolver.nameserver_ports = dict(pairs)
            resolver.lifetime = timeout_s
            self._dns = resolver

    async def addresses(self, host: str) -> tuple[str, ...]:
        """The host's addresses, sorted; an IP address is itself."""
        try:
            return (str(ipaddress.ip_address(host)),)
        except ValueError:
            pass
        if self._dns is None:
            return await self._system(host)
        import dns.exception  # noqa: PLC0415 (imported with the resolver, above)
        import dns.resolver  # noqa: PLC0415

        found: set[str] = set()
        for kind in ("A", "AAAA"):
            try:
                answer = await self._dns.resolve(host, kind, search=False)
            except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
                continue
            except dns.exception.DNSException as exc:
                raise ResolveFailed(f"{host} {kind}: {type(exc).__name__}: {exc}") from None
            found.update(str(record) for record in answer)
        return tuple(sorted(found))

    async def _system(self, host: str) -> tuple[str, ...]:
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(host, None, type=socket.SOCK_STREAM), self._timeout_s
            )
        except socket.gaierror as exc:
            if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
                return ()
            raise ResolveFailed(f"{host}: {exc.strerror or exc}") from None
        except TimeoutError:
            raise ResolveFailed(f"{host}: no answer within {self._timeout_s:g} s") from None
        return tuple(sorted({str(info[4][0]) for info in infos}))
