"""Connection plumbing shared by sync and asyncio: pool cloning and error classes."""

from __future__ import annotations

import logging
from typing import Any, Optional

from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    MasterDownError,
    MovedError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._proto import is_noreplicas, is_waiting_reply

log = logging.getLogger("redis_rlock")

#: Keys of a redis-py pool's connection kwargs the package sets itself (or must not copy).
_DROP = frozenset(
    {
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "decode_responses",
        "retry",
        "retry_on_error",
        "retry_on_timeout",
        "health_check_interval",
        "maint_notifications_pool_handler",
        "maint_notifications_config",
        "orig_host_address",
        "orig_socket_timeout",
        "orig_socket_connect_timeout",
        "himport_registry",
        "connection_pool",
        "response_callbacks",
        "event_dispatcher",
    }
)

#: Errors after which an idempotent command's outcome is unknown (or it was refused for a
#: reason that passes): the same command, with the same request id, may be sent again.
TRANSIENT: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    ConnectionError,
    TimeoutError,
    OSError,
    BusyLoadingError,
    ReadOnlyError,
    TryAgainError,
    ClusterDownError,
    MovedError,
    AskError,
    MasterDownError,
)

#: Redirections and topology errors: a cluster client refreshes its slot map after them.
TOPOLOGY: tuple[type[BaseException], ...] = (MovedError, AskError, ClusterDownError, TryAgainError)


class Stalled(RedisTimeoutError):
    """No reply within the call's bound (a stalled server, a cut network)."""


def is_transient(err: BaseException) -> bool:
    """Whether ``err`` leaves an idempotent command worth sending again."""
    if isinstance(err, TRANSIENT):
        return True
    if isinstance(err, ResponseError):
        msg = str(err)
        return msg.startswith(
            ("LOADING", "READONLY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN")
        ) or is_waiting_reply(err)
    return False


def is_resendable(err: BaseException) -> bool:
    """Whether a give-back that failed with ``err`` is sent again (a counted permits' release,
    and every background release or cancel): as :func:`is_transient`, and after ``NOREPLICAS``
    too. The module refuses give-backs of counted permits where it refuses grants (a master
    that may have been replaced: one answered there would be lost with its data, and counted
    permits have no lease); nothing was written, and the connection is dropped
    (:func:`must_drop`), so the next try reaches the current master (through a Sentinel pool),
    or this one once its replicas are back."""
    return is_transient(err) or (isinstance(err, ResponseError) and is_noreplicas(err))


def must_drop(err: BaseException) -> bool:
    """Whether a call that failed with ``err`` must drop its connection, not give it back to
    the pool: every failure but an error reply (read in full: the connection is sound), and of
    error replies a redirection or topology error, and NOREPLICAS (the connection's server may
    have been replaced: a new connection asks the Sentinels, with a Sentinel pool, for the
    current master)."""
    if not isinstance(err, ResponseError):
        return True
    return isinstance(err, TOPOLOGY) or is_noreplicas(err)


def refreshes_topology(err: BaseException) -> bool:
    """Whether a cluster client's slot map is refreshed after a call failed with ``err``: a
    topology error (a redirection, ``CLUSTERDOWN``, ``TRYAGAIN``) or a transient one."""
    return isinstance(err, TOPOLOGY) or is_transient(err)


def redirected(e: AskError, cluster: bool) -> tuple[tuple[str, int], bool]:
    """Where a ``MOVED`` or ``ASK`` reply ``e`` (the command did not run) sends the command
    again, and whether ``ASKING`` goes first (``ASK``); ``e`` raised again outside a cluster."""
    if not cluster:
        raise e
    return (e.host, e.port), not isinstance(e, MovedError)


def pool_name(at: Optional[tuple[str, int]], node: Any = None, background: bool = False) -> str:
    """The name an engine keeps its own pools of one server under: a redirection's target
    ``at``, else a cluster ``node``, as ``host:port``; a client of one server's: "". The sync
    engine's background threads (``background``) use pools of their own: ``bg:`` first."""
    if at is not None:
        name = f"{at[0]}:{at[1]}"
    elif node is not None:
        name = f"{node.host}:{node.port}"
    else:
        name = ""
    return "bg:" + name if background else name


def clone_kwargs(
    kwargs: dict[str, Any], response_timeout: float, read_timeout: bool = True
) -> dict[str, Any]:
    """A pool's connection kwargs for the package's own connections: bytes replies, every read
    and connect bounded by ``response_timeout``, keepalive on, no redis-py retries (the
    package retries itself, with its request ids, within each call's deadline). asyncio
    connections get no socket read timeout (``read_timeout=False``): the engine bounds each
    read itself (redis.asyncio answers a read timeout with a None reply, which would read as a
    grant). A Unix-socket connection gets no TCP keepalive."""
    out = {k: v for k, v in kwargs.items() if k not in _DROP}
    out.update(
        socket_timeout=response_timeout if read_timeout else None,
        socket_connect_timeout=response_timeout,
        decode_responses=False,
    )
    if "path" not in kwargs:
        # TCP only: a Unix-socket connection (``path``) takes no keepalive argument
        out["socket_keepalive"] = True
    return out
