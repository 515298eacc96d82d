"""Where cgc's independent work runs: in this process (``local``) or on a Ray cluster (``ray``).

Ray is an optional extra (``pip install 'cgc[ray]'``): ``import cgc`` and every local path work
without it, and asking for it without it installed is a one-line error naming the extra.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from types import ModuleType

from cgc.errors import CgcError, OptionError
from cgc.options import EXECUTORS, LOCAL, PLACEMENTS, RAY, SimulationOptions


def checked_executor(name: str) -> str:
    """``name`` if it is an executor's, else a one-line error naming it."""
    if name not in EXECUTORS:
        raise OptionError(f"executor {name!r}: not one of {', '.join(EXECUTORS)}", "executor")
    return name


def require_ray() -> ModuleType:
    """The ``ray`` module, or a one-line error naming the extra that installs it (with
    ``threadpoolctl``, which gives the actors the driver's BLAS threads)."""
    try:
        import ray
        import threadpoolctl  # noqa: F401
    except ImportError:
        raise CgcError("--executor ray needs Ray: pip install 'cgc[ray]'") from None
    return ray


def connect(address: str | None = None, num_cpus: int | None = None) -> ModuleType:
    """Ray, initialised once in this process: attached to the cluster at ``address`` (as
    ``ray.init`` takes it, e.g. ``auto`` or ``ray://host:10001``), or a local instance of
    ``num_cpus`` CPUs when ``address`` is None."""
    ray = require_ray()
    if address is not None:
        _check_reachable(address)
    if ray.is_initialized():
        made = _connections[-1] if _connections else address
        if address is not None and address != made:
            raise CgcError(
                f"--ray-address {address!r}: this process is on the Ray cluster at "
                f"{made or 'a local instance'!r} already"
            )
        return ray
    try:
        ray.init(
            # "local": a fresh instance of this process's own, never another session's
            address=address or "local",
            num_cpus=None if address else num_cpus,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    except (ConnectionError, ValueError) as error:  # ValueError: a missing Ray Client
        raise CgcError(f"ray_address {address!r}: {error}", "ray_address") from None
    except Exception as error:
        if address is not None or type(error) not in START_FAILURES:
            raise
        raise CgcError(
            f"executor ray: a local Ray instance did not start ({_first_sentence(error)}); "
            "try again on a less busy machine, or start Ray first (ray start --head) and pass "
            "ray_address auto",
            "executor",
            "ray_address",
        ) from None
    _connections.append(address)
    return ray


START_FAILURES: tuple[type[Exception], ...] = (RuntimeError, Exception)
"""The exact types (not their subclasses, a bug's) of what ``ray.init`` raises when a local
instance does not start in time: a ``RuntimeError`` when the GCS does not write its port
(Ray waits 30 s) or does not answer, a bare ``Exception`` when the node does not register
with it (30 s more)."""


def _first_sentence(error: Exception) -> str:
    """The first sentence of ``error``'s message, for a one-line error (Ray's go on with
    the lines of its logs)."""
    line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return re.split(r"(?<=\.)\s", line, maxsplit=1)[0].rstrip(".")


_connections: list[str | None] = []
"""The addresses this process's Ray connections were made with here (None: a local
instance); a connection someone else made is taken as it is."""


REACH_SECONDS = 5.0
"""How long a cluster's address may take to accept a connection: Ray itself retries an
address where nothing listens for minutes."""


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""What an HTTP/2 client sends first: the connection preface and an empty SETTINGS frame."""
SETTINGS = 4
"""The type of an HTTP/2 SETTINGS frame, the first thing an HTTP/2 server sends back."""


def _check_reachable(address: str) -> None:
    """A one-line error unless a gRPC server (as Ray's GCS and its client server are)
    answers at ``address``'s host and port: Ray itself retries for minutes where nothing
    listens, or where something else does (a web server, the dashboard's port). ``auto``,
    which Ray looks up on this machine, is left to Ray."""
    if address == "auto":
        return
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not host or not port.isdigit():
        raise CgcError(f"--ray-address {address!r}: expected auto, HOST:PORT or ray://HOST:PORT")
    try:
        with socket.create_connection((host, int(port)), timeout=REACH_SECONDS) as probe:
            probe.sendall(HTTP2_PREFACE)
            header = probe.recv(9)
    except OSError as error:
        reason = error.strerror or type(error).__name__
        message = f"--ray-address {address!r}: no Ray cluster answers there ({reason})"
        raise CgcError(message) from None
    if len(header) < 4 or header[3] != SETTINGS:
        message = f"--ray-address {address!r}: what answers there is not a Ray cluster"
        raise CgcError(message)


@dataclass(frozen=True)
class Backend:
    """Where a numeric run's systems run: here, or as actors on the Ray cluster at
    ``address`` (None: a local instance) placed as ``placement`` says."""

    executor: str = LOCAL
    address: str | None = None
    placement: str | None = None
    """None: packed."""

    @classmethod
    def of(cls, options: SimulationOptions) -> Backend:
        """The backend a run's options name."""
        return cls(options.executor, options.ray_address, options.ray_placement)

    def __post_init__(self) -> None:
        checked_executor(self.executor)
        if self.placement is not None and self.placement not in PLACEMENTS:
            raise OptionError(
                f"ray_placement {self.placement!r}: not one of {', '.join(PLACEMENTS)}",
                "ray_placement",
            )
        for option, value in (("ray_address", self.address), ("ray_placement", self.placement)):
            if value is not None and self.executor != RAY:
                raise OptionError(f"{option} {value!r} needs executor ray", option, "executor")
