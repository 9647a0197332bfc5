"""Every prompt, progress line and colour of ktctl on a real pseudo-terminal (issue 43).

Until issue 43 every test of ``ktctl config`` passed ``--yes`` and every progress test
patched ``isatty``: none saw that the prompt could not open ``/dev/tty`` at all, so every
interactive change printed "no terminal to ask on" and exited 2. Here ``ktctl`` runs as a
user's shell runs it: on a pty that is its controlling terminal, stdin, stdout and stderr
(``tests/ptyproc.py``), against one real daemon for the module with sim engines.

What ktctl shows on a terminal, found with ``grep -rn 'isatty\\|/dev/tty\\|input(\\|x1b'
ktctl/``: the yes/no question of every config change (``set``, ``add``, ``remove``,
``apply``, ``rollback``, ``edit``) and ``edit``'s "edit again?", and the rewritten progress
line of ``load``, ``sleep`` and ``wake`` (stderr on a terminal only). ktctl has no colours:
a test holds that a terminal gets the same plain text as a pipe.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import MARK, DaemonProc, sim_model, wait_for
from tests.ktctl.test_config_e2e import Box, box_env, write_config
from tests.ptyproc import PtyProc

pytestmark = pytest.mark.e2e

KEPT = re.compile(r"your edit is kept in (\S+);")


@pytest.fixture(scope="module")
def box(shared_marker: str) -> Iterator[Box]:
    root = Path(tempfile.mkdtemp(prefix="ktd-tty-", dir="/tmp"))
    models = [
        # Sleeps (its swaps and `ktctl sleep`); a load of 0.3 s: a few progress ticks.
        sim_model("alpha", numa=[0], sleep=True, env={"KTD_SIM_LOAD_TIME": "0.3"}),
        sim_model("beta"),
        sim_model("gamma", numa=[0]),  # node 0 is alpha's: loading it puts alpha to sleep
        sim_model("slow", env={"KTD_SIM_LOAD_TIME": "60"}),  # a load to interrupt
    ]
    cfg = write_config(root / "etc", models)
    env = {**box_env(root), MARK: shared_marker}
    daemon = DaemonProc(config=cfg, env=env, log_path=root / "ktd.log").start()
    try:
        yield Box(root, daemon)
    finally:
        daemon.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
def _from_the_original(box: Box) -> Iterator[None]:
    """The module's models.json applied and every engine stopped, whatever ran before;
    after the test, its engines stopped (the module's last test leaves none to the
    daemon's own stop)."""
    _reset(box)
    yield
    with box.client() as c:
        c.evict(all=True, force=True)


def _reset(box: Box) -> None:
    with box.client() as c:
        if any(e.state != "stopped" for e in c.status()):
            c.evict(all=True, force=True)
        if box.models.read_text() != box.original:
            c.config_apply(models_text=box.original, base=c.config_get().version)
    wait_for(
        lambda: all(e["state"] == "stopped" for e in box.daemon.engines().values()),
        timeout=30,
        what="every engine stopped",
    )


def ktctl_on_a_tty(box: Box, *argv: str, stdin: int | None = None, **env: str) -> PtyProc:
    cmd = [sys.executable, "-m", "ktctl", "--socket", box.socket, *argv]
    return PtyProc(cmd, {**box.daemon.env, **env}, stdin=stdin)


def ktctl_piped(box: Box, *argv: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "ktctl", "--socket", box.socket, *argv]
    return subprocess.run(
        cmd, env=box.daemon.env, capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip


def ttl_of(box: Box, alias: str) -> object:
    return next(e.get("ttl") for e in json.loads(box.models.read_text()) if e["alias"] == alias)


# ---------------------------------------------------------------- the questions


@pytest.mark.parametrize("answer", ["y", "yes", "Y"])
def test_config_set_asks_on_the_terminal_and_a_yes_applies(box: Box, answer: str) -> None:
    with ktctl_on_a_tty(box, "config", "set", "alpha", "ttl=5") as t:
        t.expect("apply this plan? [y/N] ")
        assert "alpha  update" in t.text  # the plan came first
        t.send(answer + "\n")
        assert t.wait() == 0, t.text
    assert "applied version" in t.text and "no terminal" not in t.text
    assert ttl_of(box, "alpha") == 5
    assert box.daemon.engines()["alpha"]["ttl"] == 5


@pytest.mark.parametrize(
    "answer", ["n\n", "\n", "maybe\n", "\x04"], ids=["n", "enter", "other", "eof"]
)
def test_anything_but_yes_applies_nothing(box: Box, answer: str) -> None:
    before = box.files()
    with ktctl_on_a_tty(box, "config", "set", "alpha", "ttl=5") as t:
        t.expect("apply this plan? [y/N] ")
        t.send(answer)
        assert t.wait() == 1, t.text
    assert "not applied" in t.text and "no terminal" not in t.text
    assert box.files() == before


def test_add_remove_apply_and_rollback_ask_too(box: Box, tmp_path: Path) -> None:
    delta = sim_model("delta")
    env = json.dumps(delta["kt"]["extra_env"])
    add = ("config", "add", "delta", f"path={delta['path']}", "numa=none",
           f"kt.kt_weight_path={delta['kt']['kt_weight_path']}", f"kt.extra_env={env}")  # fmt: skip
    doc = json.loads(box.original)
    doc[1]["ttl"] = 77
    (tmp_path / "models.json").write_text(json.dumps(doc, indent=2) + "\n")
    steps: list[tuple[tuple[str, ...], str]] = [
        (add, "apply this plan?"),
        (("config", "remove", "delta"), "apply this plan?"),
        (("config", "apply", str(tmp_path / "models.json")), "apply this plan?"),
        (("config", "rollback"), "roll back to this version?"),
    ]
    for argv, question in steps:
        with ktctl_on_a_tty(box, *argv) as t:
            t.expect(f"{question} [y/N] ")
            t.send("y\n")
            assert t.wait() == 0, t.text
        if argv[1] == "add":
            assert "delta" in box.daemon.engines()
        if argv[1] == "remove":
            wait_for(lambda: "delta" not in box.daemon.engines(), what="delta gone")
        if argv[1] == "apply":
            assert ttl_of(box, "beta") == 77
    assert ttl_of(box, "beta") is None  # the rollback undid the apply


def test_apply_from_stdin_asks_on_the_terminal(box: Box) -> None:
    """``config apply -``: stdin carries the file, the question goes to the terminal."""
    doc = json.loads(box.original)
    doc[1]["ttl"] = 42
    read, write = os.pipe()
    os.write(write, json.dumps(doc).encode())
    os.close(write)
    try:
        with ktctl_on_a_tty(box, "config", "apply", "-", stdin=read) as t:
            t.expect("apply this plan? [y/N] ")
            t.send("y\n")
            assert t.wait() == 0, t.text
    finally:
        os.close(read)
    assert ttl_of(box, "beta") == 42


def _editor(tmp_path: Path, change: str) -> str:
    script = tmp_path / "editor.py"
    script.write_text(
        "import json, sys\n"
        "path = sys.argv[1]\n"
        "doc = json.load(open(path))\n"
        f"doc[0].update({change})\n"
        "open(path, 'w').write(json.dumps(doc, indent=2) + '\\n')\n"
    )
    return f"{sys.executable} {script}"


def test_config_edit_asks_and_a_yes_applies_and_leaves_no_copy(box: Box, tmp_path: Path) -> None:
    with ktctl_on_a_tty(box, "config", "edit", EDITOR=_editor(tmp_path, "{'ttl': 9}")) as t:
        t.expect("apply this plan? [y/N] ")
        t.send("y\n")
        assert t.wait() == 0, t.text
    assert ttl_of(box, "alpha") == 9
    assert "kept" not in t.text


def test_config_edit_not_applied_keeps_the_edit_and_says_where(box: Box, tmp_path: Path) -> None:
    """A no keeps the user's edited copy (it was deleted unsaid), and the command it names
    applies it."""
    before = box.files()
    with ktctl_on_a_tty(box, "config", "edit", EDITOR=_editor(tmp_path, "{'ttl': 11}")) as t:
        t.expect("apply this plan? [y/N] ")
        t.send("n\n")
        assert t.wait() == 1, t.text
    assert box.files() == before
    kept = KEPT.search(t.text)
    assert kept, t.text
    copy = Path(kept.group(1))
    try:
        assert json.loads(copy.read_text())[0]["ttl"] == 11
        assert f"ktctl config apply --file models --base {box.version()} {copy}" in t.text
        r = ktctl_piped(box, "config", "apply", "--file", "models", "--base", box.version(),
                        str(copy), "--yes")  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert ttl_of(box, "alpha") == 11
    finally:
        shutil.rmtree(copy.parent, ignore_errors=True)


def test_config_edit_refused_asks_to_edit_again_and_keeps_the_edit(
    box: Box, tmp_path: Path
) -> None:
    before = box.files()
    editor = _editor(tmp_path, "{'ttl': 'soon'}")  # not a number: the plan refuses it
    with ktctl_on_a_tty(box, "config", "edit", EDITOR=editor) as t:
        t.expect("edit again? [y/N] ")
        t.send("n\n")
        assert t.wait() == 1, t.text
    assert box.files() == before
    kept = KEPT.search(t.text)
    assert kept, t.text
    try:
        assert json.loads(Path(kept.group(1)).read_text())[0]["ttl"] == "soon"
    finally:
        shutil.rmtree(Path(kept.group(1)).parent, ignore_errors=True)


# ---------------------------------------------------------------- progress and colour

ESCAPE = "\x1b"


def test_load_sleep_and_wake_show_progress_on_a_terminal_only(box: Box) -> None:
    with ktctl_on_a_tty(box, "load", "alpha") as t:
        assert t.wait() == 0, t.text
    # The line is rewritten in place (carriage return, erase line), then wiped before the
    # result: the last thing on the terminal is the result line.
    assert "\r\x1b[Kalpha " in t.text
    _, _, result = t.text.rpartition("\r\x1b[K")
    assert result.startswith("alpha ready on ") and ESCAPE not in result
    with ktctl_on_a_tty(box, "sleep", "alpha") as t:
        assert t.wait() == 0, t.text
    assert "\r\x1b[Kalpha " in t.text
    assert t.text.rpartition("\r\x1b[K")[2].startswith("alpha is asleep")
    with ktctl_on_a_tty(box, "wake", "alpha") as t:
        assert t.wait() == 0, t.text
    assert "\r\x1b[Kalpha " in t.text
    assert t.text.rpartition("\r\x1b[K")[2].startswith("alpha is ready")
    # On a pipe: the result line alone, no progress, no escape code.
    r = ktctl_piped(box, "sleep", "alpha")
    assert r.returncode == 0 and r.stdout.startswith("alpha is asleep")
    assert ESCAPE not in r.stdout + r.stderr
    r = ktctl_piped(box, "load", "beta")
    assert r.returncode == 0 and r.stdout.startswith("beta ready on ")
    assert ESCAPE not in r.stdout + r.stderr


def test_ctrl_c_on_a_load_stops_the_wait_and_says_ktd_goes_on(box: Box) -> None:
    """Ctrl-C typed on the terminal (the line discipline's SIGINT to ktctl's process
    group): the progress line wiped, one line saying the load goes on, exit 130."""
    with ktctl_on_a_tty(box, "load", "slow") as t:
        t.expect("\r\x1b[Kslow ")  # the progress line: the load is under way
        t.send("\x03")
        assert t.wait() == 130, t.text
    assert "ktctl: interrupted: stopped waiting; ktd goes on loading slow" in t.text
    assert box.daemon.engines()["slow"]["state"] == "starting"


def test_no_colour_on_a_terminal_nor_on_a_pipe(box: Box) -> None:
    """ktctl writes plain text: a terminal gets what a pipe gets (the line discipline's
    \\r\\n aside), no colour codes to strip in logs or scripts."""
    for argv in (("status",), ("models",), ("config", "history")):
        with ktctl_on_a_tty(box, *argv) as t:
            assert t.wait() == 0, t.text
        piped = ktctl_piped(box, *argv)
        assert ESCAPE not in t.text and ESCAPE not in piped.stdout
        assert t.text.replace("\r\n", "\n").splitlines()[0] == piped.stdout.splitlines()[0]


def test_a_swap_says_putting_to_sleep_on_the_terminal_and_in_the_plan(box: Box) -> None:
    """Issue 43: the progress line said "stopping alpha to make room" and the dry-run
    "would evict: alpha" of an engine that is put to sleep."""
    with box.client() as c:
        c.load("alpha")
    with ktctl_on_a_tty(box, "load", "--dry-run", "gamma") as t:
        assert t.wait() == 0, t.text
    assert "would put to sleep: alpha" in t.text and "would evict" not in t.text
    assert "puts alpha to sleep (idle, least recently used)" in t.text
    with ktctl_on_a_tty(box, "load", "gamma") as t:
        assert t.wait() == 0, t.text
    assert "gamma starting (putting alpha to sleep to make room)" in t.text
    assert "stopping alpha" not in t.text
    assert box.daemon.engines()["alpha"]["state"] == "asleep"
