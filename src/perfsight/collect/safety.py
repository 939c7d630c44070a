"""The one place that decides what happens when perfsight itself fails inside a training job.

Rule (PRODUCT.md, "Never hurt the training job"): an exception raised by a trace handler, by the
analysis, or by perfsight's instrumentation is reported once (a ``ProfilingDisabledWarning``, shown
once like any Python warning; the traceback at debug log level) and profiling turns itself off; the
training run goes on.  A full disk (``ENOSPC``, ``EDQUOT``, ``EFBIG``) is the common case and gets
its own message.  Nothing here may raise, except ``KeyboardInterrupt``/``SystemExit``, which
belong to the user.

Every collector (``profile``, the handlers, H2's captures, the dynamic monitor) routes its risky
calls through a :class:`Guard` instead of writing its own ``try/except``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import warnings
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger("perfsight.collect")

T = TypeVar("T")

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class ProfilingDisabledWarning(RuntimeWarning):
    """perfsight turned profiling off to protect the training run; the message says why."""


def is_disk_full(exc: BaseException) -> bool:
    """True for the errors a full disk, a quota or a file-size limit raise (also when wrapped)."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


def describe_failure(what: str, exc: BaseException) -> str:
    """One line for the log: what perfsight was doing and why it stopped."""
    if is_disk_full(exc):
        return f"perfsight: disk full while {what} ({exc}); profiling stopped, training continues"
    return (
        f"perfsight: {what} failed ({type(exc).__name__}: {exc}); "
        "profiling turned off for the rest of this run, training continues"
    )


class Guard:
    """Runs perfsight's own work; on the first failure, warns once and calls ``on_failure``
    (which turns profiling off).  After a failure, ``tripped`` is true and the reason is kept."""

    def __init__(self, on_failure: Callable[[str], None] | None = None) -> None:
        self.on_failure = on_failure
        self.reason: str | None = None

    @property
    def tripped(self) -> bool:
        return self.reason is not None

    def call(self, what: str, fn: Callable[..., T], *args: object, **kwargs: object) -> T | None:
        """``fn(*args, **kwargs)``, or ``None`` after reporting the failure."""
        try:
            return fn(*args, **kwargs)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - nothing of ours may reach the training loop
            self.fail(what, exc)
            return None

    def fail(self, what: str, exc: BaseException) -> None:
        """Record a failure that was caught elsewhere; only the first one is reported."""
        if self.reason is not None:
            log.debug("perfsight: further failure while %s: %r", what, exc)
            return
        self.reason = describe_failure(what, exc)
        log.debug("perfsight: %s", what, exc_info=exc)  # the traceback, for whoever enables debug logs
        with contextlib.suppress(Warning):  # warnings turned into errors must not reach training either
            warnings.warn(self.reason, ProfilingDisabledWarning, stacklevel=3)
        if self.on_failure is not None:
            try:
                self.on_failure(self.reason)
            except Exception:  # noqa: BLE001
                log.exception("perfsight: turning profiling off failed")
