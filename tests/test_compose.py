"""docker-compose.yml and deploy/scrapyd: structure, durability flags, wiring, commands.

There is no Docker engine here, so the file is checked as data: the services a fleet needs,
Redis that cannot lose or evict tasks and requires a password, workers that get the Redis and
store URLs in the form the package reads, nothing published beyond 127.0.0.1, and commands that
exist (console scripts of installed distributions, CLI arguments our parser accepts).
"""

from __future__ import annotations

import configparser
import re
import shlex
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from scrapy.settings import Settings

from meteorseed_scrapy.cli import build_parser
from meteorseed_scrapy.settings import redis_url_from, store_uri_from

REPO = Path(__file__).resolve().parents[1]
PASSWORD = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
# Compose's own interpolation: ${VAR}, ${VAR:?error}, ${VAR:-default}; $$ is a literal $.
_VARIABLE = re.compile(r"\$\{(\w+)(?::?([?-])[^}]*)?\}")


def interpolate(value: str, env: dict[str, str]) -> str:
    """``value`` as ``docker compose`` would pass it; a missing required variable raises."""
    def one(match: re.Match[str]) -> str:
        name, kind = match.group(1), match.group(2)
        if env.get(name):
            return env[name]
        if kind == "?":
            raise KeyError(f"{name} is required")
        return ""

    return _VARIABLE.sub(one, value.replace("$$", "\0")).replace("\0", "$")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def command_of(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    return shlex.split(command) if isinstance(command, str) else list(command)


def test_services(compose: dict[str, Any]) -> None:
    assert {"redis", "mongo", "scrapyd", "console"} <= set(compose["services"])
    assert compose["services"]["scrapyd"]["deploy"]["replicas"] >= 2


def test_redis_keeps_every_task(compose: dict[str, Any]) -> None:
    args = command_of(compose["services"]["redis"])
    assert args[0] == "redis-server"
    options = dict(zip(args[1::2], args[2::2], strict=False))
    assert options["--appendonly"] == "yes"
    assert options["--maxmemory-policy"] == "noeviction"
    assert any(v.endswith(":/data") for v in compose["services"]["redis"]["volumes"])


def test_redis_requires_a_password_from_the_environment(compose: dict[str, Any]) -> None:
    redis_service = compose["services"]["redis"]
    args = command_of(redis_service)
    required = args[args.index("--requirepass") + 1]
    assert required.startswith("${REDIS_PASSWORD:?")  # compose refuses to start without it
    assert interpolate(required, {"REDIS_PASSWORD": PASSWORD}) == PASSWORD
    with pytest.raises(KeyError, match="REDIS_PASSWORD is required"):
        interpolate(required, {})
    # The healthcheck authenticates, and only PONG counts (redis-cli exits 0 on NOAUTH).
    assert redis_service["environment"]["REDISCLI_AUTH"] == required
    assert "grep -q PONG" in " ".join(redis_service["healthcheck"]["test"])
    assert "ports" not in redis_service  # never published


def test_every_redis_url_carries_the_password(compose: dict[str, Any]) -> None:
    urls = [(name, key, value) for name, service in compose["services"].items()
            for key, value in (service.get("environment") or {}).items()
            if str(value).startswith(("redis://", "rediss://"))]
    assert {name for name, _, _ in urls} == {"scrapyd", "console"}
    for name, key, value in urls:
        assert "${REDIS_PASSWORD:?" in value, (name, key)
        parsed = redis.connection.parse_url(interpolate(value, {"REDIS_PASSWORD": PASSWORD}))
        assert parsed["password"] == PASSWORD and parsed["host"] == "redis", (name, key)


def test_only_the_console_is_published_and_on_loopback(compose: dict[str, Any]) -> None:
    published = {name: service["ports"] for name, service in compose["services"].items()
                 if service.get("ports")}
    assert list(published) == ["console"]
    for ports in published.values():
        assert all(str(p).startswith("127.0.0.1:") for p in ports), ports


def test_deploy_doc_says_how_to_put_tls_in_front() -> None:
    text = (REPO / "docs" / "deploy.md").read_text()
    section = text[text.index("## TLS"):]
    assert "reverse proxy" in section and "127.0.0.1:8080" in section
    assert "rediss://" in section and "REDIS_PASSWORD" in section


@pytest.mark.parametrize("name", ["scrapyd", "console"])
def test_services_get_redis_and_store_urls(compose: dict[str, Any], name: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    env = {key: interpolate(str(value), {"REDIS_PASSWORD": PASSWORD, "METEORSEED_API_TOKEN": "t"})
           for key, value in compose["services"][name]["environment"].items()}
    assert re.fullmatch(rf"redis://:{PASSWORD}@redis:6379/\d+", env["METEORSEED_REDIS_URL"])
    assert env["METEORSEED_STORE_URI"].startswith("mongodb://mongo:27017/")
    # Scrapy does not read METEORSEED_* from the environment; a worker falls back on these.
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert redis_url_from(Settings()) == env["METEORSEED_REDIS_URL"]
    assert store_uri_from(Settings()) == env["METEORSEED_STORE_URI"]


def test_worker_image_and_commands(compose: dict[str, Any]) -> None:
    scrapyd = compose["services"]["scrapyd"]
    dockerfile = REPO / scrapyd["build"]["context"] / scrapyd["build"]["dockerfile"]
    text = dockerfile.read_text()
    for source in re.findall(r"^COPY (.+) \S+$", text, re.M):
        for path in source.split():
            assert (REPO / path).exists(), f"{dockerfile.name} copies missing {path}"
    install = next(line for line in text.splitlines() if line.startswith("RUN pip install"))
    assert " . " in f"{install} " and "scrapyd" in install
    scripts = {ep.name for ep in entry_points(group="console_scripts")}
    assert command_of(scrapyd)[0] == "scrapyd" and "scrapyd" in scripts
    # The console runs from the same image, with our own console script.
    assert compose["services"]["console"]["image"] == scrapyd["image"]
    assert "meteorseed" in scripts


def test_console_serves_the_api_and_console_behind_a_token(compose: dict[str, Any]) -> None:
    console = compose["services"]["console"]
    command = command_of(console)
    assert command[0] == "meteorseed"
    args = build_parser().parse_args(command[1:])
    assert args.command == "serve" and args.host == "0.0.0.0" and not args.insecure_no_auth
    assert console["ports"] == [f"127.0.0.1:{args.port}:{args.port}"]
    # The token comes from the environment (never the command line, which `ps` shows).
    assert "METEORSEED_API_TOKEN" in console["environment"] and args.token is None


def test_scrapyd_knows_the_project() -> None:
    conf = configparser.ConfigParser()
    conf.read(REPO / "deploy" / "scrapyd" / "scrapyd.conf")
    assert conf["scrapyd"]["bind_address"] == "0.0.0.0"
    for project, module in conf["settings"].items():
        path = REPO / "example_project" / (module.replace(".", "/") + ".py")
        assert path.exists(), f"[settings] {project} = {module}: no {path}"
