"""A response's head is capped (METEORSEED_MAX_RESPONSE_HEADERS lines,
METEORSEED_RESPONSE_HEADERS_MAXSIZE bytes): past either, the connection is closed and the task
ends ``ignored`` with the cap named (issue 22: 300,000 header lines held the event loop 10.7 s).
A real worker downloads from a loopback server that sends many header lines, directly, through
a proxy and over TLS; a project's own DOWNLOAD_HANDLERS stay."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import socketserver
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from meteorseed_scrapy.addon import MeteorSeedAddon
from meteorseed_scrapy.header_cap import HANDLER, LINES_SETTING, SIZE_SETTING, STAT
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.setting_checks import check_settings
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.validators import ConfigError
from tests.e2e_helpers import add_tasks, start_worker


class ManyHeaders(socketserver.StreamRequestHandler):
    """``/many/<n>``: a 200 with n header lines; ``/long/<n>``: one header of n bytes (as
    continuation lines of 1000); anything else: a 200 with a few. A proxy's absolute URL is
    answered as its path (this server is its own proxy)."""

    def handle(self) -> None:
        head = self.rfile.readline().split()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass
        path = head[1].decode() if len(head) > 1 else "/"
        path = "/" + path.split("://", 1)[-1].split("/", 1)[-1] if "://" in path else path
        kind, _, count = path.strip("/").partition("/")
        lines: list[bytes] = []
        if kind == "many":
            lines = [b"X-Many-%d: %d" % (i, i) for i in range(int(count))]
        elif kind == "long":
            lines = [b"X-Long: start"] + [b" " + b"v" * 999] * (int(count) // 1000)
        body = b"<html><title>ok</title></html>"
        with contextlib.suppress(OSError):  # (the client hangs up once over the cap)
            self.wfile.write(b"\r\n".join([b"HTTP/1.1 200 OK", *lines,
                                           b"Content-Type: text/html",
                                           b"Content-Length: %d" % len(body), b"", body]))


class TLSServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    context: ssl.SSLContext

    def get_request(self) -> tuple[Any, Any]:
        sock, address = self.socket.accept()
        return self.context.wrap_socket(sock, server_side=True), address


def _self_signed(directory: Path) -> ssl.SSLContext:
    """A TLS context with a certificate for 127.0.0.1 signed by itself (Scrapy's default
    context factory does not verify certificates, as browsers' first request would)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    pem = directory / "cert.pem"
    pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pem)
    return context


def _serve(server: socketserver.ThreadingTCPServer) -> Iterator[str]:
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def header_server() -> Iterator[str]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), ManyHeaders)
    server.daemon_threads = True
    yield from _serve(server)


@pytest.fixture
def tls_header_server(tmp_path: Path) -> Iterator[str]:
    server = TLSServer(("127.0.0.1", 0), ManyHeaders)
    server.context = _self_signed(tmp_path)
    yield from _serve(server)


def test_heads_over_either_cap_end_their_tasks_ignored_naming_the_cap(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: Any,
        header_server: str) -> None:
    base = f"http://{header_server}"
    tasks = add_tasks(redis_url, namespace, [ExecTask.create(seed_id="s", site_id="probe", url=u)
                                             for u in (f"{base}/many/100000", f"{base}/ok",
                                                       f"{base}/many/40", f"{base}/long/5000")])
    # (through the server as a proxy: a port nothing listens on, reached only through it)
    proxied = add_tasks(redis_url, namespace, [ExecTask.create(
        seed_id="s", site_id="probe", url="http://127.0.0.1:9/many/100000",
        meta={"proxy": base})])
    caps: dict[str, Any] = {LINES_SETTING: 50, SIZE_SETTING: 4000}
    worker = start_worker(tmp_path, redis_url, namespace, ROBOTSTXT_OBEY=False, **caps)
    assert worker.wait() == 0, worker.log()[-3000:]
    keys = KeyLayout(namespace).for_site("probe")

    def record(task: ExecTask) -> dict[str, Any]:
        return dict(json.loads(sync_redis.get(keys.done(task.task_id))))

    many, ok, few, long = (record(t) for t in tasks)
    assert (ok["outcome"], few["outcome"]) == ("done", "done")
    assert many["outcome"] == record(proxied[0])["outcome"] == "ignored"
    assert f"{LINES_SETTING} (50 lines)" in many["reason"]
    assert f"{LINES_SETTING} (50 lines)" in record(proxied[0])["reason"]
    assert long["outcome"] == "ignored" and f"{SIZE_SETTING} (4000 bytes)" in long["reason"]
    assert worker.stats()[STAT] == 3
    warnings = [line for line in worker.log().splitlines() if "abandoned" in line]
    assert len(warnings) == 3 and all("WARNING" in line for line in warnings), warnings
    assert any(f"{base}/many/100000" in line for line in warnings)


def test_over_https_too(tmp_path: Path, redis_url: str, namespace: str, sync_redis: Any,
                        tls_header_server: str) -> None:
    base = f"https://{tls_header_server}"
    many, ok = add_tasks(redis_url, namespace, [
        ExecTask.create(seed_id="s", site_id="probe", url=f"{base}/{path}")
        for path in ("many/100000", "ok")])
    caps: dict[str, Any] = {LINES_SETTING: 50}
    worker = start_worker(tmp_path, redis_url, namespace, ROBOTSTXT_OBEY=False, **caps)
    assert worker.wait() == 0, worker.log()[-3000:]
    keys = KeyLayout(namespace).for_site("probe")
    records = [json.loads(sync_redis.get(keys.done(t.task_id))) for t in (many, ok)]
    assert [r["outcome"] for r in records] == ["ignored", "done"], records
    assert f"{LINES_SETTING} (50 lines)" in records[0]["reason"]


def _handlers(**project: Any) -> dict[str, Any]:
    settings = Settings()
    settings.setdict(project, priority="project")
    MeteorSeedAddon().update_settings(settings)
    return dict(settings.getwithbase("DOWNLOAD_HANDLERS"))


def test_the_capped_handler_serves_http_and_https_unless_the_project_set_its_own() -> None:
    assert _handlers()["http"] == _handlers()["https"] == HANDLER
    playwright = "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler"
    assert _handlers(DOWNLOAD_HANDLERS={"http": playwright, "https": playwright}) | {
        "ftp": None} == _handlers() | {"http": playwright, "https": playwright, "ftp": None}
    own = _handlers(DOWNLOAD_HANDLERS={"https": None})
    assert (own["http"], own["https"]) == (HANDLER, None)


@pytest.mark.parametrize("name", [LINES_SETTING, SIZE_SETTING])
@pytest.mark.parametrize("value", [-1, "many", 1.5])
def test_a_bad_cap_is_refused_naming_the_setting(name: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=name):
        check_settings(get_crawler(settings_dict={name: value}).settings)
