"""What the connection layer reads and writes below ASGI (router/http/connection.py): a request
head's facts as they arrive, and an error as a whole raw HTTP/1.1 response."""

from __future__ import annotations

from http import HTTPStatus

from router.errors import GatewayError
from router.request.reply import request_id_headers


def raw_error(error: GatewayError) -> bytes:
    """`error` as a whole HTTP/1.1 response that closes the connection (below ASGI)."""
    body = error.body()
    head = [b"HTTP/1.1 %d %s" % (error.status_code, HTTPStatus(error.status_code).phrase.encode())]
    head.append(b"content-type: application/json")
    head += [f"{name}: {value}".encode() for name, value in request_id_headers().items()]
    if error.retry_after_s is not None:
        head.append(f"retry-after: {error.retry_after_s:g}".encode())
    head += [b"content-length: %d" % len(body), b"connection: close"]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class BodyState:
    """One request's body as its head declared it and as it arrives."""

    __slots__ = (
        "authorization",
        "cap",
        "cap_key",
        "chunked",
        "complete",
        "declared",
        "discarding",
        "forwarded_for",
        "invalid",
        "received",
    )

    def __init__(self) -> None:
        self.authorization = b""  # its shares are its key's, when this is a valid one
        self.forwarded_for = b""
        self.declared = 0  # Content-Length (0: none)
        self.chunked = False
        self.invalid = False
        self.cap = 0
        self.cap_key = ""
        self.received = 0
        self.complete = False
        self.discarding = False

    def read_head(self, url: bytes, headers: list[tuple[bytes, bytes]]) -> int:
        """Read the body's facts from a whole head (`headers` lowercased, as uvicorn keeps
        them); the head's size as counted against `limits.max_header_bytes`."""
        size = len(url)
        for name, value in headers:
            size += len(name) + len(value) + 4
            if name == b"content-length":
                text = value.strip()
                if not text.isdigit() or (self.declared and int(text) != self.declared):
                    self.invalid = True
                else:
                    self.declared = int(text)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                self.chunked = True
            elif name == b"authorization":
                self.authorization = value
            elif name == b"x-forwarded-for":
                self.forwarded_for = value
        return size

    def over_cap(self) -> str:
        return f"exceeds the limit of {self.cap} bytes ({self.cap_key})"

    @property
    def expected(self) -> bool:
        return self.declared > 0 or self.chunked
