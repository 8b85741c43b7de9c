"""Issue 29 item 4: what one HTTP client may hold. Body limits that hold for chunked bodies, a deadline on
request headers, the keep-alive timeout, a cap on connections (cli/serve/limits.py).

The first tests run uvicorn in a thread over a small app with short limits; the slow ones are the
issue's acceptance 3 against a real `infer serve` on the tiny synthetic model: a chunked 200 MB body
is refused with 413 while the server's peak RSS grows by under 100 MB, and 500 clients sending their
headers a byte at a time are all closed within 15 s while `/health` keeps answering within 1 s.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from cli_process import running_server
from fastapi import Body, FastAPI, Request

from infer.cli.serve.launch import ServerProcess
from infer.cli.serve.limits import LINGER_S, BodyLimit, HttpLimits

pytest_plugins = ["conftest_synthetic"]

SMALL_LIMIT = 100_000
LIMITS = HttpLimits(header_timeout_s=1.0, keep_alive_timeout_s=1, max_connections=8, max_header_bytes=4096)
SLOW_HEAD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 4000


# -- raw HTTP clients ---------------------------------------------------------------------------------
def _chunk(size: int) -> bytes:
    return f"{size:x}\r\n".encode() + b" " * size + b"\r\n"


def send_chunked_until_answered(
    address: tuple[str, int], path: str, total: int, chunk: int = 64 * 1024, timeout: float = 60
) -> tuple[bytes, int]:
    """POST a chunked body of `total` bytes, reading while writing; (the answer, body bytes sent)
    once the server answers (or `total` is sent and the answer read)."""
    sock = socket.create_connection(address)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    )
    sock.sendall(head.encode())
    sock.setblocking(False)
    sent, pending, answer, last_sent = 0, b"", b"", False
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            want_write = [] if last_sent and not pending else [sock]
            readable, writable, _ = select.select([sock], want_write, [], 1.0)
            if readable:
                data = sock.recv(65536)
                answer += data
                if not data or _complete(answer):
                    break
            elif writable:
                if not pending:
                    size = min(chunk, total - sent)
                    pending = _chunk(size) if size else b"0\r\n\r\n"  # the last chunk
                    sent += size
                    last_sent = not size
                pending = pending[sock.send(pending) :]
    except (BrokenPipeError, ConnectionResetError):
        answer += _drain(sock)
    finally:
        sock.close()
    return answer, sent


def _complete(answer: bytes) -> bool:
    head, sep, body = answer.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def read_answer(sock: socket.socket) -> bytes:
    """Read one whole answer (or what came before the server closed) from a blocking socket."""
    answer = b""
    while not _complete(answer) and (data := sock.recv(65536)):
        answer += data
    return answer


def _readable(sock: socket.socket) -> bool:
    """Whether `sock` has bytes (or its end) to read now (poll: select() stops at fd 1024)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _drain(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def status_of(answer: bytes) -> int:
    """The status code of a raw HTTP answer (0 if there is none)."""
    parts = answer.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


class SlowClients:
    """Connections that send a request head one byte per `interval` and note when the server closes them."""

    def __init__(self, address: tuple[str, int], count: int, head: bytes = SLOW_HEAD) -> None:
        self.head = head
        self.opened: dict[socket.socket, float] = {}
        self.closed: dict[socket.socket, float] = {}
        self.answers: dict[socket.socket, bytes] = {}
        self.sent: dict[socket.socket, int] = {}
        for _ in range(count):
            sock = socket.create_connection(address)
            sock.setblocking(False)
            self.opened[sock] = time.monotonic()
            self.sent[sock] = 0

    @property
    def open(self) -> list[socket.socket]:
        """The connections the server has not closed yet."""
        return [s for s in self.opened if s not in self.closed]

    def step(self) -> None:
        """Send one more byte on every open connection; note those the server answered or closed."""
        for sock in self.open:
            try:
                if _readable(sock):
                    data = sock.recv(65536)
                    self.answers[sock] = self.answers.get(sock, b"") + data
                    if not data or _complete(self.answers[sock]):
                        self.closed[sock] = time.monotonic()
                    continue
                if self.sent[sock] < len(self.head):
                    self.sent[sock] += sock.send(self.head[self.sent[sock] : self.sent[sock] + 1])
            except OSError:
                self.closed[sock] = time.monotonic()

    def run(self, seconds: float, interval: float = 0.1) -> None:
        """Step until every connection is closed or `seconds` pass."""
        deadline = time.monotonic() + seconds
        while self.open and time.monotonic() < deadline:
            self.step()
            time.sleep(interval)

    def close(self) -> None:
        """Close every socket on this side."""
        for sock in self.opened:
            sock.close()


# -- uvicorn in a thread over a small app ---------------------------------------------------------------
def small_app(max_body_bytes: int, idle_timeout_s: float) -> FastAPI:
    """A body-model route (read by FastAPI, as the API's routes are) and a raw one."""
    app = FastAPI()

    @app.post("/model")
    async def model_route(body: dict[str, Any] = Body(...)) -> dict[str, int]:
        return {"keys": len(body)}

    @app.post("/raw")
    async def raw_route(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes, idle_timeout_s=idle_timeout_s)
    return app


@pytest.fixture(scope="module")
def address() -> Iterator[tuple[str, int]]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    app = small_app(SMALL_LIMIT, idle_timeout_s=1.0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **LIMITS.uvicorn_options()))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield sock.getsockname()
    server.should_exit = True
    thread.join(timeout=10)


def _error_of(answer: bytes) -> dict[str, Any]:
    import json

    return json.loads(answer.partition(b"\r\n\r\n")[2])["error"]


@pytest.mark.parametrize("path", ["/model", "/raw"])
def test_a_chunked_body_over_the_limit_is_413_as_it_arrives(address: tuple[str, int], path: str) -> None:
    total = 500 * SMALL_LIMIT
    answer, sent = send_chunked_until_answered(address, path, total=total, chunk=8192)
    assert status_of(answer) == 413, answer[:300]
    error = _error_of(answer)
    assert error["code"] == "request_too_large" and str(SMALL_LIMIT) in error["message"]
    assert b"connection: close" in answer.lower()
    # refused while the body was still coming (what was sent beyond the limit sat in socket buffers)
    assert sent < total / 2, sent


def test_bodies_within_the_limit_pass_chunked_or_not(address: tuple[str, int]) -> None:
    answer, _ = send_chunked_until_answered(address, "/raw", total=SMALL_LIMIT, chunk=8192)
    assert status_of(answer) == 200 and answer.endswith(b'{"bytes":%d}' % SMALL_LIMIT), answer[-200:]
    with httpx.Client(base_url=f"http://{address[0]}:{address[1]}") as http:
        assert http.post("/model", json={"a": 1, "b": 2}).json() == {"keys": 2}
        big = http.post("/raw", content=b" " * (SMALL_LIMIT + 1))
        assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
        assert "is 100001 bytes" in big.json()["error"]["message"]  # Content-Length: refused unread


def test_an_answer_before_the_body_closes_lingering(address: tuple[str, int]) -> None:
    """Refused unread, the answer ends in a FIN, and the server reads on (discarding) what the client
    still sends: a plain close would answer those bytes with a reset, which can drop the end of the
    413 (CI once saw httpx read its head, then lose its body). The lingering ends within its bound."""
    with socket.create_connection(address) as sock:
        sock.sendall(b"POST /raw HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n")
        sock.settimeout(5)
        answer = read_answer(sock)
        assert status_of(answer) == 413 and _complete(answer), answer
        assert sock.recv(100) == b""  # the server's side is done
        for _ in range(5):  # a reset would come back within a round trip and fail a later send
            sock.sendall(b" " * 100_000)
            time.sleep(0.05)
        started = time.monotonic()
        with pytest.raises(OSError):  # but not for ever: LINGER_MAX_BYTES or LINGER_S end it
            while time.monotonic() - started < 10:
                sock.sendall(b" " * 100_000)
                time.sleep(0.01)
        assert time.monotonic() - started < LINGER_S + 2


def test_a_body_that_stops_arriving_is_408(address: tuple[str, int]) -> None:
    with socket.create_connection(address) as sock:
        sock.sendall(b"POST /raw HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b" " * 10)
        sock.settimeout(10)
        started = time.monotonic()
        answer = read_answer(sock)
    assert status_of(answer) == 408 and _error_of(answer)["code"] == "request_timeout"
    assert 0.9 < time.monotonic() - started < 5


def test_headers_sent_a_byte_at_a_time_are_cut_off_at_the_deadline(address: tuple[str, int]) -> None:
    clients = SlowClients(address, 3)
    try:
        clients.run(seconds=6, interval=0.05)
        assert not clients.open
        for sock, opened in clients.opened.items():
            assert 0.9 < clients.closed[sock] - opened < 3
            assert status_of(clients.answers[sock]) == 408, clients.answers[sock]
            assert 10 < clients.sent[sock] < len(SLOW_HEAD)  # bytes kept coming: the deadline held anyway
    finally:
        clients.close()


def test_a_silent_connection_and_a_slow_second_request_are_cut_off(address: tuple[str, int]) -> None:
    silent = socket.create_connection(address)
    silent.settimeout(5)
    started = time.monotonic()
    assert status_of(read_answer(silent)) == 408
    assert time.monotonic() - started < 3
    silent.close()
    # after one answered request, the next request's head gets the same deadline
    with socket.create_connection(address) as sock:
        sock.settimeout(5)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_of(read_answer(sock)) == 200
        sock.sendall(b"GET /heal")
        started = time.monotonic()
        deadline = started + 4
        answer = b""
        while time.monotonic() < deadline:
            sock.sendall(b"t")  # a byte every 0.2 s: never idle, never complete
            time.sleep(0.2)
            if _readable(sock):
                answer = sock.recv(65536)
                break
        assert status_of(answer) == 408 and time.monotonic() - started < 2.5
    # a body no route reads, still trickling in after the answer: closed at the same deadline
    with socket.create_connection(address) as sock:
        sock.settimeout(5)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
        assert status_of(read_answer(sock)) == 200
        started = time.monotonic()
        closed = False
        while not closed and time.monotonic() < started + 4:
            try:
                sock.sendall(b"x")
                time.sleep(0.2)
                closed = _readable(sock) and sock.recv(65536) == b""
            except OSError:
                closed = True
        assert closed and time.monotonic() - started < 2.5


def test_an_idle_kept_alive_connection_is_closed(address: tuple[str, int]) -> None:
    with socket.create_connection(address) as sock:
        sock.settimeout(5)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_of(read_answer(sock)) == 200
        started = time.monotonic()
        assert sock.recv(65536) == b""  # uvicorn's timeout_keep_alive (1 s here)
        assert time.monotonic() - started < 3


def test_an_unfinished_request_head_over_the_size_bound_is_400(address: tuple[str, int]) -> None:
    """h11 buffers at most `max_header_bytes` of a head it cannot parse yet (a head that arrives whole
    in one read is parsed at once)."""
    with socket.create_connection(address) as sock:
        sock.settimeout(5)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 3000)
        time.sleep(0.1)
        sock.sendall(b"a" * 3000)
        assert status_of(read_answer(sock)) == 400


def test_connections_beyond_the_cap_get_503_at_once(address: tuple[str, int]) -> None:
    held = [socket.create_connection(address) for _ in range(LIMITS.max_connections)]
    try:
        time.sleep(0.2)
        with socket.create_connection(address) as extra:
            extra.settimeout(5)
            answer = read_answer(extra)
        assert status_of(answer) == 503 and b"retry-after: 1" in answer.lower()
        assert _error_of(answer)["code"] == "server_overloaded"
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.3)  # the held ones are gone: a new client is served again
    with httpx.Client(base_url=f"http://{address[0]}:{address[1]}") as http:
        assert http.get("/health").status_code == 200


# -- acceptance 3 against `infer serve` -----------------------------------------------------------------
def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@pytest.fixture(scope="module")
def server(tiny_gguf: Path) -> Iterator[ServerProcess]:
    with running_server(["-m", str(tiny_gguf), "-c", "128", "--max-num-seqs", "4", "--seed", "3"]) as process:
        yield process


def _address(server: ServerProcess) -> tuple[str, int]:
    assert server.url is not None
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def _greedy(url: str) -> str:
    body = {"prompt": "hello", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["text"])


@pytest.mark.slow
def test_a_chunked_200mb_body_is_413_and_the_server_stays_small(server: ServerProcess) -> None:
    assert server.url is not None
    solo = _greedy(server.url)  # warm: the first request's allocations are not the body's
    pid = server.popen.pid
    peak_before, rss_before = _status_kib(pid, "VmHWM"), _status_kib(pid, "VmRSS")
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
        answer, sent = send_chunked_until_answered(_address(server), path, total=200 * 2**20)
        assert status_of(answer) == 413, answer[:300]
        assert _error_of(answer)["code"] == "request_too_large"
        assert sent < 100 * 2**20, sent  # refused near the 64 MiB limit, not after 200 MB
    peak_growth_mb = (_status_kib(pid, "VmHWM") - peak_before) / 1024
    rss_growth_mb = (_status_kib(pid, "VmRSS") - rss_before) / 1024
    assert peak_growth_mb < 100, (peak_growth_mb, rss_growth_mb)
    assert _greedy(server.url) == solo


@pytest.mark.slow
def test_500_slow_header_clients_are_closed_while_health_answers(server: ServerProcess) -> None:
    assert server.url is not None
    solo = _greedy(server.url)
    clients = SlowClients(_address(server), 500)
    health_seconds: list[float] = []
    failures: list[str] = []
    done = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=server.url, timeout=5) as http:
            while not done.is_set():
                started = time.monotonic()
                try:
                    status = http.get("/health").status_code
                except httpx.HTTPError as exc:
                    failures.append(repr(exc))
                    status = 0
                health_seconds.append(time.monotonic() - started)
                if status != 200:
                    failures.append(f"status {status}")
                time.sleep(0.2)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        clients.run(seconds=20, interval=0.2)
    finally:
        done.set()
        prober.join()
        clients.close()
    assert not clients.open, f"{len(clients.open)} of 500 still open after 20 s"
    lifetimes = [clients.closed[s] - opened for s, opened in clients.opened.items()]
    assert max(lifetimes) < 15, max(lifetimes)
    assert all(status_of(clients.answers.get(s, b"")) == 408 for s in clients.opened)
    assert not failures, failures[:5]
    assert len(health_seconds) > 10 and max(health_seconds) < 1.0, max(health_seconds)
    assert _greedy(server.url) == solo
