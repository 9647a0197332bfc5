"""A config moved to another path, with a real daemon (issue 43, item 6).

The history keeps the path each version was read at. ktd started again with ``--config``
at a new path (the same state dir) must run from that path through a rollback: the old
version's texts are written to the files it was started with, and a later edit of them is
a change at reload (the daemon followed the old path, and reloaded edits of its own file
as "no changes")."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from ktd import protocol as p
from ktd.core import configtext
from tests.conftest import ConfigWriter, sim_model


def test_a_rollback_after_a_restart_at_a_new_path_keeps_the_new_path(
    tmp_path: Path, daemon_factory: Any
) -> None:
    a = ConfigWriter(tmp_path / "a")([sim_model("m")])
    first = daemon_factory(a)
    with first.client(timeout=60) as c:
        got = c.config_get()
        text = configtext.set_fields(got.models_text or "", "m", {"ttl": 30})
        c.config_apply(models_text=text, base=got.version)
    assert first.stop() == 0
    b_dir = tmp_path / "b"
    shutil.copytree(a.parent, b_dir)  # the files moved: ktd is started from the copy
    b = b_dir / "config.json"
    a_files = (a.parent / "models.json").read_bytes()
    second = daemon_factory(b)  # the same state dir: the same history
    with second.client(timeout=60) as c:
        start = c.config_history().versions
        oldest = start[-1]
        assert oldest.seq == 1 and oldest.how == "start"
        back = c.config_rollback(1, base=c.config_get().version)
        assert isinstance(back, p.ConfigApplyReply)
        now = c.config_get()
        assert now.config_path == str(b)
        assert json.loads(now.models_text or "")[0].get("ttl", 0) == 0
        assert (a.parent / "models.json").read_bytes() == a_files  # the old path untouched
        doc = json.loads((b_dir / "models.json").read_text())
        doc[0]["ttl"] = 77
        (b_dir / "models.json").write_text(json.dumps(doc, indent=2))
        reloaded = c.reload()
        assert isinstance(reloaded, p.Ok) and "no changes" not in reloaded.message
        assert c.status("m")[0].ttl == 77
        assert c.config_history().versions[0].how == "reload"
