"""Test-session set-up that must run before any test module imports grpc, and the store
fixtures: the gateway's tests run against both backends (SQLite files and PostgreSQL)."""

from collections.abc import Iterator

import pytest

import analysim  # noqa: F401  (sets GRPC_ENABLE_FORK_SUPPORT=false before grpc is imported; see there)
from tests.pg import PgCluster, throwaway_cluster
from tests.polling import scaled
from tests.procs import kill_started

BACKENDS = ["sqlite", "postgresql"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test's timeout (its own, its module's or the configured one) stretched by this
    machine's measured slowdown, as every deadline inside the tests is."""
    if not config.pluginmanager.hasplugin("timeout"):  # pytest-timeout absent or disabled: no timeouts
        return
    default = float(config.getini("timeout") or 0)
    for item in items:
        marker = item.get_closest_marker("timeout")
        seconds = float(marker.args[0]) if marker is not None and marker.args else default
        if seconds > 0:
            item.add_marker(pytest.mark.timeout(scaled(seconds)), append=False)


@pytest.fixture(autouse=True)
def _kill_started_processes() -> Iterator[None]:
    """Every process a test started through tests.procs.started is gone when the test ends,
    timeouts and failures included."""
    yield
    kill_started()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """One throwaway PostgreSQL per test process (each xdist worker has its own), skipped
    where PostgreSQL cannot be started."""
    with throwaway_cluster() as cluster:
        yield cluster


def _db(backend: str, request: pytest.FixtureRequest, tmp: pytest.TempPathFactory) -> str:
    if backend == "sqlite":
        return str(tmp.mktemp("store") / "store.db")
    return request.getfixturevalue("pg_cluster").new_database()


@pytest.fixture(scope="module", params=BACKENDS)
def module_db(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh store location for a module's gateway: a SQLite path or a PostgreSQL URL."""
    return _db(request.param, request, tmp_path_factory)


@pytest.fixture(params=BACKENDS)
def store_db(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh store location for one test: a SQLite path or a PostgreSQL URL."""
    return _db(request.param, request, tmp_path_factory)


@pytest.fixture
def pg_db(pg_cluster: PgCluster) -> str:
    """A fresh PostgreSQL database's URL."""
    return pg_cluster.new_database()
