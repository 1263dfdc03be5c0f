"""Loopback servers for the remote-source tests and ``bench remote`` (needs ``moto[server]``): moto's S3 server and a tiny
HTTP server honouring ``Range``, both counting the requests and bytes they serve, able to inject
faults and to add a fixed latency to every request (as an object store's first byte costs
10-100 ms: :attr:`Traffic.latency`).

Both bind 127.0.0.1 on a free port and are started and stopped by whoever uses them. The range
server speaks HTTP/1.1 with keep-alive and Nagle's algorithm off (a response's header and body
go out at once, not 40 ms apart), so the latency added is the only wait a request sees.
"""

from __future__ import annotations

import http.server
import logging
import multiprocessing
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

__all__ = ["RangeHTTPServer", "S3Server", "ServerProcess", "Traffic"]


class Traffic:
    """What a server sent: response body bytes (``sent``), ranged GETs (``gets``) and requests of
    any kind (``requests``: listings and metadata too); ``faults`` makes the next ranged GETs
    fail (``"503"``: a 503 reply; ``"drop"``: the connection cut mid-body); ``latency`` (seconds)
    is slept before answering each request."""

    def __init__(self, latency: float = 0.0) -> None:
        self.sent = 0
        self.gets = 0
        self.requests = 0
        self.latency = latency
        self.faults: list[str] = []
        self.require_key: str | None = None  # S3: refuse (403) requests signed with another key
        self.lock = threading.Lock()

    def reset(self) -> None:
        with self.lock:
            self.sent = self.gets = self.requests = 0

    def arrived(self) -> None:
        """Count a request and wait the added latency (in the request's own thread)."""
        with self.lock:
            self.requests += 1
        if self.latency > 0:
            time.sleep(self.latency)

    def next_fault(self) -> str | None:
        with self.lock:
            return self.faults.pop(0) if self.faults else None

    def count(self, n: int, ranged: bool) -> None:
        with self.lock:
            self.sent += n
            self.gets += ranged


def _counting(app: Any, traffic: Traffic) -> Callable[..., Iterable[bytes]]:
    """A WSGI middleware counting ``app``'s body bytes and injecting ``traffic.faults``."""

    def wrapped(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        traffic.arrived()
        key = traffic.require_key
        if key is not None and f"Credential={key}/" not in environ.get("HTTP_AUTHORIZATION", ""):
            body = (
                b"<Error><Code>InvalidAccessKeyId</Code><Message>The AWS Access Key Id you "
                b"provided does not exist in our records.</Message></Error>"
            )
            start_response(
                "403 Forbidden",
                [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))],
            )
            return [body]
        ranged = environ.get("REQUEST_METHOD") == "GET" and "HTTP_RANGE" in environ
        fault = traffic.next_fault() if ranged else None
        if fault == "503":
            body = b"<Error><Code>SlowDown</Code><Message>injected</Message></Error>"
            start_response(
                "503 Service Unavailable",
                [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))],
            )
            return [body]
        chunks = list(app(environ, start_response))
        data = b"".join(chunks)
        if fault == "drop":  # promise the whole body, send half, cut the connection
            traffic.count(len(data) // 2, ranged)

            def cut() -> Iterable[bytes]:
                yield data[: len(data) // 2]
                raise ConnectionResetError("injected: connection cut mid-body")

            return cut()
        traffic.count(len(data), ranged)
        return [data]

    return wrapped


class S3Server:
    """moto's S3 server on 127.0.0.1 behind :func:`_counting`; :attr:`endpoint` is its URL;
    ``latency`` seconds are added to every request (:attr:`Traffic.latency`)."""

    def __init__(self, latency: float = 0.0) -> None:
        from moto.server import ThreadedMotoServer
        from werkzeug.serving import make_server

        self.traffic = Traffic(latency)
        traffic = self.traffic

        class Counted(ThreadedMotoServer):
            def _server_entry(self) -> None:
                from moto.moto_server.werkzeug_app import (
                    DomainDispatcherApplication,
                    MotoRequestHandler,
                    create_backend_app,
                )

                app = DomainDispatcherApplication(create_backend_app)
                self._server = make_server(
                    self._ip_address,
                    self._port,
                    _counting(app, traffic),
                    True,
                    request_handler=MotoRequestHandler,
                )
                self._server_ready_event.set()
                self._server.serve_forever()

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        self._server = Counted(ip_address="127.0.0.1", port=0, verbose=False)

    def start(self) -> S3Server:
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        return self

    def stop(self) -> None:
        self._server.stop()

    def options(self, key: str = "testing", secret: str = "testing") -> dict[str, Any]:
        """Storage options for s3fs against this server (botocore's own retries off: the
        source's retries are under test)."""
        return s3_options(self.endpoint, key, secret)

    def upload(self, bucket: str, files: dict[str, bytes]) -> None:
        """Create ``bucket`` and put ``files`` (key -> bytes) in it."""
        import s3fs

        if getattr(self, "_fs", None) is None:  # one client: botocore's start-up takes seconds
            self._fs = s3fs.S3FileSystem(**self.options(), skip_instance_cache=True)
        fs = self._fs
        if not fs.exists(bucket):
            fs.mkdir(bucket)
        for key, data in files.items():
            fs.pipe_file(f"{bucket}/{key}", data)


def s3_options(endpoint: str, key: str = "testing", secret: str = "testing") -> dict[str, Any]:
    """Storage options for s3fs against a moto server at ``endpoint``."""
    return {
        "key": key,
        "secret": secret,
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "eu-west-1"},
        "config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"}},
    }


_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class RangeHTTPServer:
    """A threaded HTTP/1.1 server on 127.0.0.1 serving ``files`` (path -> bytes) with ``Range``,
    ``HEAD``, ``Content-Length``, an ``ETag`` per content and keep-alive; counts requests and
    bytes in ``traffic`` and waits ``latency`` seconds before answering each request."""

    def __init__(self, files: dict[str, bytes], latency: float = 0.0) -> None:
        self.files = files
        self.traffic = Traffic(latency)
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: one connection serves many requests
            disable_nagle_algorithm = True  # TCP_NODELAY: no 40 ms wait between header and body

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _head(self, send_body: bool) -> None:
                outer.traffic.arrived()
                data = outer.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                etag = f'"{hash(data) & 0xFFFFFFFF:08x}-{len(data)}"'
                m = _RANGE.match(self.headers.get("Range", ""))
                fault = outer.traffic.next_fault() if m and send_body else None
                if fault == "503":
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                lo, hi = 0, len(data)
                if m:
                    lo = int(m.group(1))
                    hi = min(len(data), int(m.group(2)) + 1) if m.group(2) else len(data)
                    if lo >= len(data) and len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {lo}-{max(hi - 1, lo)}/{len(data)}")
                else:
                    self.send_response(200)
                body = memoryview(data)[lo:hi]  # no copy of a large range
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("ETag", etag)
                self.end_headers()
                if send_body:
                    # counted before the write: the client may have the body (and a test may
                    # reset the counters) before this thread runs again after it
                    if fault == "drop":
                        outer.traffic.count(len(body) // 2, True)
                        self.wfile.write(body[: len(body) // 2])
                        self.close_connection = True
                        return
                    outer.traffic.count(len(body), bool(m))
                    self.wfile.write(body)

            def do_GET(self) -> None:
                self._head(True)

            def do_HEAD(self) -> None:
                self._head(False)

        class Server(http.server.ThreadingHTTPServer):
            request_queue_size = 256  # many connections opened at once (a client's burst)

        self._httpd = Server(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def start(self) -> RangeHTTPServer:
        self._thread.start()
        host, port = self._httpd.server_address[:2]
        self.url = f"http://{host!s}:{port}"
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(10)


ServerKind = Literal["http", "s3"]


def _serve_in_child(conn: Any, kind: ServerKind, files: Mapping[str, str], latency: float) -> None:
    """The body of a :class:`ServerProcess`: start the server, upload or hold ``files`` (name ->
    local path), send its URL, then answer the parent's commands until ``stop``."""
    data = {name: Path(path).read_bytes() for name, path in files.items()}
    server: RangeHTTPServer | S3Server
    if kind == "http":
        server = RangeHTTPServer({f"/{name}": b for name, b in data.items()}).start()
        url = server.url
    else:
        server = S3Server().start()
        buckets: dict[str, dict[str, bytes]] = {}
        for name, b in data.items():
            bucket, _, key = name.partition("/")
            buckets.setdefault(bucket, {})[key] = b
        for bucket, objects in buckets.items():
            server.upload(bucket, objects)
        url = server.endpoint
    server.traffic.latency = latency  # the uploads above waited it too: set, not counted
    server.traffic.reset()
    conn.send(url)
    while True:
        command, arg = conn.recv()
        t = server.traffic
        if command == "stop":
            server.stop()
            conn.send(None)
            return
        if command == "reset":
            t.reset()
        elif command == "latency":
            t.latency = float(arg)
        conn.send({"requests": t.requests, "gets": t.gets, "sent": t.sent})


class ServerProcess:
    """A loopback server in a spawned process of its own: ``"http"`` (:class:`RangeHTTPServer`,
    ``files`` served at ``/name``) or ``"s3"`` (:class:`S3Server`, ``files`` named
    ``bucket/key`` uploaded). A benchmark's client then shares no interpreter lock with the
    server's threads, as with a real store. ``files`` maps each name to a local path (read by
    the child); ``latency`` seconds are added to each request (:meth:`set_latency` changes it).
    :attr:`url` is the HTTP base URL or the S3 endpoint."""

    def __init__(
        self, kind: ServerKind, files: Mapping[str, str | Path], latency: float = 0.0
    ) -> None:
        self.kind = kind
        ctx = multiprocessing.get_context("spawn")  # the parent's threads stay out of it
        self._conn, child = ctx.Pipe()
        paths = {name: str(path) for name, path in files.items()}
        self._process = ctx.Process(
            target=_serve_in_child, args=(child, kind, paths, latency), daemon=True
        )
        self.url = ""

    def start(self) -> ServerProcess:
        self._process.start()
        if not self._conn.poll(120):
            self._process.kill()
            raise RuntimeError(f"the {self.kind} server process did not start in 120 s")
        self.url = self._conn.recv()
        return self

    def _ask(self, command: str, arg: Any = None) -> dict[str, int]:
        self._conn.send((command, arg))
        got: dict[str, int] = self._conn.recv()
        return got

    def traffic(self) -> dict[str, int]:
        """``{"requests", "gets", "sent"}`` since the last :meth:`reset`."""
        return self._ask("traffic")

    def reset(self) -> None:
        self._ask("reset")

    def set_latency(self, seconds: float) -> None:
        self._ask("latency", seconds)

    def options(self) -> dict[str, Any]:
        """Storage options for s3fs against this server (``"s3"`` only)."""
        return s3_options(self.url)

    def stop(self) -> None:
        if self._process.is_alive():
            self._ask("stop")
        self._process.join(10)
