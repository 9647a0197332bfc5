"""Other parties on this machine, for tests of who may do what: a group and users made for
the test run (``groupadd``/``useradd`` as root, kept if already there), and commands run
as one of them with ``setpriv`` (a real other uid, its own groups, no capability left).

Trust is tested as the other party, never only by reading the code (the brief's rule):
a test that needs a member of ``daemon.group`` or a stranger takes them from here. CI
runs as root; elsewhere the tests that need this skip with ``needs_root``'s reason.

Made machine-wide and left in place: each is made once per machine, and two test workers
making the same one at once is fine (the loser finds it made).
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: Skip a test that acts as another uid where it cannot (not root, no setpriv).
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv (util-linux) to act as another user",
)


@dataclass(frozen=True)
class Peer:
    """A user of this machine as the tests act as it."""

    name: str
    uid: int
    gid: int  # its primary group
    groups: tuple[int, ...]  # its supplementary groups

    def argv(self, command: list[str]) -> list[str]:
        """``command`` run as this user: real and effective uid and gid, its
        supplementary groups and nothing else (root's are cleared)."""
        groups = (
            [f"--groups={','.join(str(g) for g in self.groups)}"]
            if self.groups
            else ["--clear-groups"]
        )
        return [
            "setpriv",
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            *groups,
            "--inh-caps=-all",
            "--",
            *command,
        ]

    def python(
        self, code: str, *, env: dict[str, str] | None = None, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``code`` with this repo's interpreter (ktd and ktctl importable) as this
        user, from ``/`` (a directory every user may enter)."""
        run_env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
        run_env.update(env or {})
        return subprocess.run(
            self.argv([sys.executable, "-c", code]),
            env=run_env,
            cwd="/",
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )


def ensure_group(name: str) -> int:
    """The gid of group ``name``, made (``groupadd --system``) when missing."""
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        pass
    subprocess.run(["groupadd", "--system", name], capture_output=True, check=False)
    return grp.getgrnam(name).gr_gid  # KeyError: it could not be made (said by pytest)


def ensure_user(name: str, groups: tuple[str, ...] = ()) -> Peer:
    """User ``name`` (a system user, no home, no login shell, its own primary group),
    made when missing; member of ``groups`` (each made when missing) as the tests see
    it: ``setpriv`` gives it exactly these supplementary groups."""
    gids = tuple(ensure_group(g) for g in groups)
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--user-group", "--shell",
             "/usr/sbin/nologin", name],
            capture_output=True,
            check=False,
        )  # fmt: skip
        entry = pwd.getpwnam(name)
    return Peer(name=name, uid=entry.pw_uid, gid=entry.pw_gid, groups=gids)


def open_to_all(path: Path) -> None:
    """Let every user pass through ``path`` and its parents up to ``/tmp`` (a test's temp
    directory is 0700): what a real runtime dir's parent (/run) allows. Only the
    directory ktd itself makes then decides who gets in."""
    for d in (path, *path.parents):
        if d == Path("/tmp") or d == Path("/"):
            break
        mode = d.stat().st_mode & 0o777
        if mode & 0o005 != 0o005:
            d.chmod(mode | 0o005)
