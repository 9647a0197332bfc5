"""Who may connect with ``daemon.group`` set, tried as the other users (issue 43, item 9).

The docs promise that the members of ``daemon.group`` may connect and nobody else can
reach the sockets. With a group that is not ktd's primary one, the sockets were created
``root:root 0770``: the members, let into the runtime dir, were refused at ``connect``.
A member (another uid with the group) and a stranger (another uid without it) each try
both sockets at the kernel's level and ping with ``ktctl``'s client, through ``setpriv``.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from tests.conftest import ConfigWriter, sim_model, wait_for
from tests.peers import ensure_group, ensure_user, needs_root, open_to_all

GROUP = "ktdtest-sock"

#: Run as the peer: connect to each socket as the kernel sees it, then a ping with the
#: real client. Prints one JSON line.
TRY = """
import json, socket, sys
out = {}
for name in ("control.sock", "events.sock"):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(sys.argv[1] + "/" + name)
        out[name] = "connected"
    except OSError as exc:
        out[name] = type(exc).__name__
    finally:
        s.close()
from ktctl import Client, DaemonUnreachable
try:
    with Client(sys.argv[1] + "/control.sock", timeout=3) as c:
        out["ping"] = c.ping().version != ""
except DaemonUnreachable:
    out["ping"] = False
print(json.dumps(out))
"""


@needs_root
def test_a_member_of_daemon_group_connects_and_a_stranger_cannot(
    write_config: ConfigWriter, daemon_factory: Any, runtime_dir: Path
) -> None:
    member = ensure_user("ktdtest-member", (GROUP,))
    stranger = ensure_user("ktdtest-stranger")
    gid = ensure_group(GROUP)
    assert gid != os.getgid()  # the case: not ktd's primary group
    open_to_all(runtime_dir)  # as /run is: the runtime dir's own mode decides
    d = daemon_factory(write_config([sim_model("a-kt")], daemon={"group": GROUP}))
    run = d.socket.parent
    code = TRY.replace("sys.argv[1]", repr(str(run)))
    got = {}
    for peer in (member, stranger):
        done = peer.python(code)
        assert done.returncode == 0, done.stderr
        got[peer.name] = json.loads(done.stdout)
    assert got["ktdtest-member"] == {
        "control.sock": "connected",
        "events.sock": "connected",
        "ping": True,
    }
    assert got["ktdtest-stranger"] == {
        "control.sock": "PermissionError",
        "events.sock": "PermissionError",
        "ping": False,
    }
    for path in (run, d.socket, run / "events.sock"):
        st = path.lstat()
        assert st.st_gid == gid, path
        assert not st.st_mode & stat.S_IRWXO, path  # nothing for the others
    # Removed (systemd-tmpfiles, a mistaken rm): bound again, and given to the group again.
    d.socket.unlink()
    wait_for(lambda: d.socket.exists() and d.socket.lstat().st_gid == gid, what="rebound")
    again = member.python(code)
    assert json.loads(again.stdout)["ping"] is True, again.stderr
