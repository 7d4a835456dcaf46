"""A real DNS server on loopback for discovery tests: UDP in a thread, answering A and AAAA
queries from `records`, which a test changes while traffic runs (NXDOMAIN for a name it does
not hold). Messages are dnspython's; the server is ours, a few lines."""

from __future__ import annotations

import ipaddress
import socket
import threading

import dns.message
import dns.rcode
import dns.rdata
import dns.rdataclass
import dns.rdatatype


class Nameserver:
    def __init__(self) -> None:
        self._records: dict[str, tuple[str, ...]] = {}
        self._lock = threading.Lock()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.queries = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def set(self, name: str, *addresses: str) -> None:
        """`name` resolves to `addresses` from now on (none: a name with no records)."""
        with self._lock:
            self._records[name] = addresses

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, peer = self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            self.sock.sendto(self._answer(dns.message.from_wire(data)).to_wire(), peer)

    def _answer(self, query: dns.message.Message) -> dns.message.Message:
        self.queries += 1
        reply = dns.message.make_response(query)
        for question in query.question:
            name = question.name.to_text(omit_final_dot=True)
            with self._lock:
                found = self._records.get(name)
            if found is None:
                reply.set_rcode(dns.rcode.NXDOMAIN)
                continue
            version = 4 if question.rdtype == dns.rdatatype.A else 6
            matching = [a for a in found if ipaddress.ip_address(a).version == version]
            if matching:
                rrset = reply.find_rrset(
                    reply.answer, question.name, dns.rdataclass.IN, question.rdtype, create=True
                )
                for address in matching:
                    rrset.add(dns.rdata.from_text(dns.rdataclass.IN, question.rdtype, address), ttl=0)
        return reply

    def __enter__(self) -> Nameserver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()
