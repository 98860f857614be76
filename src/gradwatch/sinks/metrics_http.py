"""`gradwatch tail --metrics-port N`: the textfile's metrics, served over HTTP for Prometheus.

The metric families are `prometheus.families`, so names, labels and help texts are the textfile's.
The tail loop pushes fresh `RunMetrics` at each wake-up (at most `LOOK_EVERY_S` apart, so a scrape
sees values at most that old); prometheus_client's server thread reads the latest list at each
scrape. The two threads share one list reference, swapped under a lock, and nothing else.

prometheus_client (0.20 or later, whose server can be shut down) is an optional dependency,
`gradwatch[prometheus]`: only this module imports it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from gradwatch.errors import UsageError
from gradwatch.sinks.prometheus import RunMetrics, families

__all__ = ["MetricsServer"]

INSTALL_HINT = "--metrics-port needs prometheus_client: pip install 'gradwatch[prometheus]'"


class MetricsServer:
    """An HTTP endpoint `/metrics` on its own daemon thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: list[RunMetrics] = []
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @classmethod
    def start(cls, addr: str, port: int) -> MetricsServer:
        """Listen on addr:port (0: any free port, see `url`).

        Raises:
            UsageError: prometheus_client is not installed, or the address cannot be bound.
        """
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError:
            raise UsageError(INSTALL_HINT) from None
        self = cls()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self.runs))
        try:
            self._server, self._thread = start_http_server(port, addr, registry)
        except (OSError, ValueError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise UsageError(f"--metrics-port {port}: cannot listen on {addr}: {reason}") from None
        return self

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://[{host}]:{port}/metrics" if ":" in host else f"http://{host}:{port}/metrics"

    def update(self, runs: list[RunMetrics]) -> None:
        with self._lock:
            self._runs = runs

    def runs(self) -> list[RunMetrics]:
        with self._lock:
            return self._runs

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


class _Collector:
    """Turns `prometheus.families` into prometheus_client metric families at each scrape."""

    def __init__(self, runs: Callable[[], list[RunMetrics]]) -> None:
        self._runs = runs

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import Metric

        for fam in families(self._runs()):
            # prometheus_client names a counter family without `_total`, and its samples with it
            metric = Metric(fam.name.removesuffix("_total") if fam.kind == "counter" else fam.name, fam.help, fam.kind)
            for labels, value in fam.samples:
                metric.add_sample(fam.name, labels, float(value))
            yield metric
