"""A loopback TCP proxy that can be cut and restored, to put a tracker outage in front of a real server.

    with TcpProxy("127.0.0.1", 5000) as proxy:     # listens on 127.0.0.1:<free port>
        client = MlflowClient(f"http://{proxy.address}")
        proxy.cut()        # open connections closed, new ones accepted and reset at once
        proxy.stall()      # open connections closed, new ones accepted and never answered (a hung server)
        proxy.restore()    # new connections forwarded again
        proxy.delay_s = 0.2  # each answer of the server held this long first (a slow tracker)

Threads and stdlib sockets only: one thread accepts, two threads per connection copy bytes each way.
While cut, nothing reaches the target: a request sent during the outage is lost, never half-delivered.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

_ACCEPT_POLL_S = 0.1  # how often the accept loop looks at the stop flag
_CONNECT_TIMEOUT_S = 5.0
_CHUNK = 65536


class TcpProxy:
    """Forwards TCP connections from 127.0.0.1:<port> to ``target_host:target_port``."""

    def __init__(self, target_host: str, target_port: int, host: str = "127.0.0.1", port: int = 0) -> None:
        """Set the target and the listening address (port 0: a free port, chosen at start)."""
        self.target = (target_host, int(target_port))
        self._bind = (host, int(port))
        self._listener: socket.socket | None = None
        self._accepter: threading.Thread | None = None
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()  # both ends of every open forwarded connection
        self._cut = False
        self._stalled = False
        self._held: list[socket.socket] = []  # connections accepted while stalled, never answered
        self._stopped = threading.Event()
        self.refused = 0
        """Connections reset because they arrived while the proxy was cut."""
        self.delay_s = 0.0
        """Each read of the target's answer waits this long before it is passed on (a slow tracker)."""

    @property
    def port(self) -> int:
        """The port the proxy listens on (after start)."""
        if self._listener is None:
            raise RuntimeError("TcpProxy is not started")
        return self._listener.getsockname()[1]

    @property
    def address(self) -> str:
        """``host:port`` to connect to instead of the target (after start)."""
        return f"{self._bind[0]}:{self.port}"

    @property
    def is_cut(self) -> bool:
        """Whether the proxy is cut right now."""
        return self._cut

    def start(self) -> TcpProxy:
        """Bind, listen and start accepting connections in a background thread; returns self."""
        if self._listener is not None:
            raise RuntimeError("TcpProxy already started")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(self._bind)
        listener.listen(64)
        listener.settimeout(_ACCEPT_POLL_S)
        self._listener = listener
        self._stopped.clear()
        self._accepter = threading.Thread(target=self._accept_loop, name=f"tcp-proxy-{self.port}", daemon=True)
        self._accepter.start()
        return self

    def stop(self) -> None:
        """Stop accepting, close every open connection and the listening socket; waits for the accept thread."""
        self._stopped.set()
        if self._accepter is not None:
            self._accepter.join(timeout=5)
            self._accepter = None
        self._close_all()
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def cut(self) -> None:
        """Start an outage: close every open connection, and reset each new one as soon as it is accepted."""
        with self._lock:
            self._cut = True
        self._close_all()

    def stall(self) -> None:
        """Start a hang: close every open connection; accept new ones and never send them a byte."""
        with self._lock:
            self._stalled = True
        self._close_all()

    def restore(self) -> None:
        """End the outage: connections held by a stall are reset, new ones are forwarded again."""
        with self._lock:
            self._cut = self._stalled = False
            held, self._held = self._held, []
        for sock in held:
            _reset(sock)

    def __enter__(self) -> TcpProxy:
        """Start the proxy for the length of a ``with`` block."""
        return self.start()

    def __exit__(self, *exc: object) -> None:
        """Stop the proxy at the end of the ``with`` block."""
        self.stop()

    def _accept_loop(self) -> None:
        """Accept connections until stopped: reset them while cut, else connect to the target and pump."""
        assert self._listener is not None
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:  # the poll interval passed
                continue
            except OSError:
                return  # listener closed
            client.settimeout(None)
            if self._cut:
                self.refused += 1
                _reset(client)
                continue
            with self._lock:
                if self._stalled:
                    self._held.append(client)
                    continue
            try:
                upstream = socket.create_connection(self.target, timeout=_CONNECT_TIMEOUT_S)
                upstream.settimeout(None)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                if self._cut:  # cut while we were connecting: this one must not get through either
                    self.refused += 1
                    _reset(client)
                    _reset(upstream)
                    continue
                self._sockets.update((client, upstream))
            running = [2]  # pumps of this connection still running; the last one closes both sockets
            for src, dst, slow in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(target=self._pump, args=(src, dst, running, slow), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, running: list[int], slow: bool = False) -> None:
        """Copy bytes from ``src`` to ``dst`` (``slow``: the target's answers, held ``delay_s`` each); pass an end of
        stream on, abort both on an error.

        The second pump to end closes both sockets (the first only half-closes ``dst``, so a
        response still in flight the other way is delivered whole).
        """
        try:
            while True:
                data = src.recv(_CHUNK)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    break
                if slow and self.delay_s:
                    time.sleep(self.delay_s)
                dst.sendall(data)
        except OSError:  # reset, or closed by cut()/stop(): the whole connection goes
            self._forget(src, dst, abort=True)
        with self._lock:
            running[0] -= 1
            last = running[0] == 0
        if last:
            self._forget(src, dst, abort=False)

    def _forget(self, *socks: socket.socket, abort: bool) -> None:
        """Stop tracking these sockets and close them: abort (RST) or gracefully."""
        with self._lock:
            for sock in socks:
                self._sockets.discard(sock)
        for sock in socks:
            if abort:
                _reset(sock)
            else:
                sock.close()

    def _close_all(self) -> None:
        """Abort every open forwarded connection (both ends) and every held one; their pump threads then end."""
        with self._lock:
            socks, self._sockets = list(self._sockets) + self._held, set()
            self._held = []
        for sock in socks:
            _reset(sock)


def _reset(sock: socket.socket) -> None:
    """Abort a connection: wake any thread reading it (shutdown), then close with linger 0 (a RST, no TIME_WAIT)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv on this socket
    except OSError:
        pass
    sock.close()
