"""Loopback servers for the remote-source tests and ``bench remote`` (needs ``moto[server]``): moto's S3 server and a tiny
HTTP server honouring ``Range``, both counting the bytes they send and able to inject faults.

Both bind 127.0.0.1 on a free port and are started and stopped by whoever uses them.
"""

from __future__ import annotations

import http.server
import logging
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["RangeHTTPServer", "S3Server", "Traffic"]


class Traffic:
    """What a server sent: response body bytes and ranged GETs; ``faults`` makes the next ranged
    GETs fail (``"503"``: a 503 reply; ``"drop"``: the connection cut mid-body)."""

    def __init__(self) -> None:
        self.sent = 0
        self.gets = 0
        self.faults: list[str] = []
        self.require_key: str | None = None  # S3: refuse (403) requests signed with another key
        self.lock = threading.Lock()

    def reset(self) -> None:
        with self.lock:
            self.sent = self.gets = 0

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
    """moto's S3 server on 127.0.0.1 behind :func:`_counting`; :attr:`endpoint` is its URL."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer
        from werkzeug.serving import make_server

        self.traffic = Traffic()
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
        return {
            "key": key,
            "secret": secret,
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "eu-west-1"},
            "config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"}},
        }

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


_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class RangeHTTPServer:
    """A threaded HTTP server on 127.0.0.1 serving ``files`` (path -> bytes) with ``Range``,
    ``HEAD``, ``Content-Length`` and an ``ETag`` per content; counts bytes in ``traffic``."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.traffic = Traffic()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _head(self, send_body: bool) -> None:
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
                body = data[lo:hi]
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("ETag", etag)
                self.end_headers()
                if send_body:
                    if fault == "drop":
                        self.wfile.write(body[: len(body) // 2])
                        outer.traffic.count(len(body) // 2, True)
                        self.close_connection = True
                        return
                    self.wfile.write(body)
                    outer.traffic.count(len(body), bool(m))

            def do_GET(self) -> None:
                self._head(True)

            def do_HEAD(self) -> None:
                self._head(False)

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
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
