"""Every change ktd makes to the HTTP stack under it, installed in one place, on the
versions it was checked on.

Why one module: the frontend reaches into Hypercorn's trio worker and h11's private
writer for its hot path and its timeouts (``transport.py``: writes that fit go out at
once, chunks framed without h11's events, deaf clients let go, HTTP/2's close race;
``intake.py``: the request intake without scheduler trips), and works around
Quart-Trio's cancelling of Hypercorn's end-of-response bookkeeping
(``afterlife.py``). Each depends on private code of one release line; a new release
may move it, and a patch that silently stops matching is a frontend that hangs or
leaks slots rather than one that fails. So the frontend refuses to start on a
version it was not checked on, saying which and what was checked; ``pyproject.toml``
pins the same ranges so a normal install never meets the refusal.
"""

from __future__ import annotations

import math
from importlib import metadata

from ktd.frontend import intake, transport

#: distribution -> the release lines (``major.minor``) the patches were read against,
#: and what of it they touch.
CHECKED: dict[str, tuple[tuple[str, ...], str]] = {
    "hypercorn": (
        ("0.18",),
        "trio worker: TCPServer.protocol_send, _read_data and __init__, HTTPStream.app_send, "
        "H11Protocol, the task group (transport.py, intake.py)",
    ),
    "h11": (("0.16",), "h11._writers.ChunkedWriter and Connection._writer (transport.py)"),
    "quart-trio": (
        ("0.12",),
        "TrioASGIHTTPConnection cancels its request on http.disconnect (afterlife.py)",
    ),
}


class UncheckedVersion(RuntimeError):
    """The installed HTTP stack is not one the patches were checked on."""


def line_of(version: str) -> str:
    """``"0.18.0"`` -> ``"0.18"``: patches are checked per release line."""
    return ".".join(version.split(".")[:2])


def problems(installed: dict[str, str] | None = None) -> list[str]:
    """What is installed that the patches were not checked on (``installed``:
    distribution -> version, read from the environment when None)."""
    out = []
    for dist, (lines, touches) in CHECKED.items():
        try:
            version = metadata.version(dist) if installed is None else installed[dist]
        except (metadata.PackageNotFoundError, KeyError):
            out.append(f"{dist} is not installed")
            continue
        if line_of(version) not in lines:
            checked = ", ".join(f"{line}.x" for line in lines)
            out.append(f"{dist} {version} (ktd's patches were checked on {checked}: {touches})")
    return out


def check() -> None:
    """Raise :class:`UncheckedVersion` naming what is installed that was not checked."""
    found = problems()
    if found:
        raise UncheckedVersion(
            "will not start on an HTTP stack its patches were not checked on: "
            + "; ".join(found)
            + ". Install the versions pyproject.toml pins."
        )


def install(send_timeout: float = math.inf) -> None:
    """Install every patch (idempotent; the last ``send_timeout`` given applies), or
    raise :class:`UncheckedVersion` before touching anything."""
    check()
    transport.install(send_timeout)  # Hypercorn's writes
    intake.install()  # Hypercorn's request intake
