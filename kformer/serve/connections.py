"""Deadlines for a request to arrive: uvicorn's HTTP/1.1 protocol (h11) with two of its own.

uvicorn closes a connection idle between requests (`timeout_keep_alive`, which starts once a
response is sent) and caps the connections it serves (`limit_concurrency`), but a connection
that sends nothing, or its headers or body a byte at a time, it keeps for as long as the client
likes: a few hundred such clients would hold every connection the cap allows. So a request's
line and headers must arrive within `headers_seconds` of the connection, or of their first byte
on a connection kept alive (idle between requests, uvicorn's timeout applies); its body within
`body_seconds` of its headers. A connection past either deadline is
answered 408 (where nothing was answered yet) and closed; the request's handler, if it was
reading the body, sees the client leave, and the request counts as 408 (`TIMED_OUT`).
"""

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

TIMED_OUT = "kformer.timed_out"  # set in a request's ASGI scope when its body came too late


def protocol(headers_seconds, body_seconds):
    """uvicorn's h11 protocol class (uvicorn.Config's `http`) with these deadlines."""
    return type("DeadlineProtocol", (DeadlineProtocol,), {"HEADERS": headers_seconds, "BODY": body_seconds})


class DeadlineProtocol(H11Protocol):
    """H11Protocol with a deadline for the client's headers (HEADERS seconds) and one for its body
    (BODY seconds); `protocol` sets them."""

    HEADERS = BODY = None

    def connection_made(self, transport):
        self.deadline, self.waiting_for = None, None
        super().connection_made(transport)
        self._arm("headers", self.HEADERS)

    def connection_lost(self, exc):
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data):
        if self.waiting_for is None and self.conn.their_state is h11.IDLE:  # a next request begins
            self._arm("headers", self.HEADERS)
        super().data_received(data)

    def handle_events(self):
        super().handle_events()
        state = self.conn.their_state
        if state is h11.SEND_BODY and self.waiting_for != "body":
            self._arm("body", self.BODY)
        elif state not in (h11.IDLE, h11.SEND_BODY):  # the request is in: its handler runs
            self._disarm()

    def _arm(self, what, seconds):
        self._disarm()
        self.waiting_for = what
        self.deadline = self.loop.call_later(seconds, self._expired)

    def _disarm(self):
        if self.deadline is not None:
            self.deadline.cancel()
        self.deadline, self.waiting_for = None, None

    def _expired(self):
        what, self.deadline = self.waiting_for, None
        if self.transport.is_closing() or self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
            return
        if what == "body" and self.scope is not None:
            self.scope[TIMED_OUT] = True
        # a body comes late after its request was answered early (a 413 on its length): one answer
        answered = what == "body" and self.cycle is not None and self.cycle.response_started
        if not answered:
            seconds = self.HEADERS if what == "headers" else self.BODY
            body = f'{{"error": "the request\'s {what} did not arrive within {seconds:g} s"}}'.encode()
            self.transport.write(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
            )
        self.transport.close()
