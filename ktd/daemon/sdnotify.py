"""The daemon's name for :mod:`ktd.sdnotify`, which moved out of ``ktd/daemon/`` (issue 45)
because the frontend notifies systemd too and must not import the daemon."""

from ktd.sdnotify import notify, watchdog_interval

__all__ = ["notify", "watchdog_interval"]
