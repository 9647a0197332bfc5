"""``ktctl config`` against a real daemon and sim engines (issue 39): get, plan, apply, set,
add, remove, edit, history, rollback, hand edits seen at reload, and every bad input
answered with a clear error naming the field while the files, the running config and
the engines stay as they were.

One daemon for the module, put back before each test to the module's models.json with
every engine stopped, through the public path (pytest-xdist hands the tests out one by
one, in any order); the full-disk test runs
its own daemon with its config on a 64 KiB tmpfs in a mount namespace of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ktctl import Client, KtdError
from ktctl.cli import main
from ktd import protocol as p
from ktd.core import configtext
from tests.conftest import MARK, DaemonProc, own_env, sim_model, wait_for

REPO = Path(__file__).resolve().parents[2]


class Box:
    def __init__(self, root: Path, daemon: DaemonProc) -> None:
        self.root = root
        self.daemon = daemon
        self.models = root / "etc" / "models.json"
        self.config = root / "etc" / "config.json"
        self.original = self.models.read_text()

    @property
    def socket(self) -> str:
        return str(self.daemon.socket)

    def client(self) -> Client:
        return Client(self.daemon.socket, timeout=30)

    def files(self) -> tuple[bytes, bytes]:
        return self.config.read_bytes(), self.models.read_bytes()

    def running(self) -> str:
        with self.client() as c:
            return c.config_history().running

    def version(self) -> str:
        with self.client() as c:
            return c.config_get().version


def write_config(etc: Path, models: list[dict[str, Any]], **daemon: Any) -> Path:
    etc.mkdir(parents=True, exist_ok=True)
    cfg = {
        "models_file": "models.json",
        "daemon": {"stop_grace": 5, "drain_timeout": 5, "health_interval": 1, **daemon},
    }
    (etc / "models.json").write_text(json.dumps(models, indent=2) + "\n")
    (etc / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return etc / "config.json"


def box_env(root: Path) -> dict[str, str]:
    env = own_env()
    env["KTD_RUNTIME_DIR"] = str(root / "run")
    env["KTD_STATE_DIR"] = str(root / "state")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


@pytest.fixture(scope="module")
def box(shared_marker: str) -> Iterator[Box]:
    root = Path(tempfile.mkdtemp(prefix="ktd-cfg-", dir="/tmp"))
    models = [
        sim_model("alpha"),
        sim_model("beta", ttl=600),
        sim_model("slow", env={"KTD_SIM_LOAD_TIME": "120"}),
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
def _from_the_original(request: pytest.FixtureRequest) -> None:
    """The shared daemon as the module started it: every engine stopped, the original
    models.json applied when a test changed it."""
    if "box" not in request.fixturenames:
        return
    box: Box = request.getfixturevalue("box")
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
    assert box.models.read_text() == box.original


def ktctl(capsys: pytest.CaptureFixture[str], box: Box, *argv: str) -> tuple[int, str, str]:
    code = main(["--socket", box.socket, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def ready(box: Box, alias: str) -> dict[str, Any]:
    return wait_for(
        lambda: (e := box.daemon.engines()[alias])["state"] == "ready" and e,
        timeout=30,
        what=f"{alias} ready",
    )


# ---------------------------------------------------------------- the ordinary path


def test_get_prints_the_file_as_it_is_and_its_version(
    box: Box, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = ktctl(capsys, box, "config", "get")
    assert code == 0 and out == box.models.read_text()
    assert f"{box.models}: version {box.version()}" in err
    code, out, _ = ktctl(capsys, box, "config", "get", "beta", "--json")
    doc = json.loads(out)
    assert (doc["alias"], doc["index"], doc["entry"]["ttl"]) == ("beta", 1, 600)
    code, out, _ = ktctl(capsys, box, "config", "get", "--file", "config")
    assert out == box.config.read_text()


def test_set_shows_the_plan_writes_one_value_and_records_who(
    box: Box, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("LOGNAME", "alice")
    before = box.models.read_text()
    code, out, err = ktctl(capsys, box, "config", "set", "alpha", "ttl=30", "kt.ctx=4096", "--yes")
    assert code == 0, err
    assert "alpha  update     stopped  kt.ctx 0 -> 4096; ttl 0 -> 30" in out
    assert "applied version" in out
    # Exactly those two values changed, in the file's own layout.
    assert box.models.read_text() == configtext.set_fields(
        before, "alpha", {"ttl": 30, "kt.ctx": 4096}
    )
    code, out, _ = ktctl(capsys, box, "config", "history", "--json")
    newest = json.loads(out)["versions"][0]
    assert (newest["how"], newest["uid"], newest["claimed"]) == ("apply", os.getuid(), "alice")
    assert newest["what"] == "update: alpha (kt.ctx, ttl)"
    assert box.daemon.engines()["alpha"]["ttl"] == 30


def test_a_launch_change_restarts_the_running_engine(
    box: Box, capsys: pytest.CaptureFixture[str]
) -> None:
    with box.client() as c:
        c.load("beta")
    pid = ready(box, "beta")["pid"]
    code, out, err = ktctl(capsys, box, "config", "set", "beta", "kt.ctx=2048", "--yes")
    assert code == 0, err
    assert "beta   restart" in out and "kt.ctx 0 -> 2048" in out
    wait_for(
        lambda: (e := box.daemon.engines()["beta"])["state"] == "ready" and e["pid"] != pid,
        timeout=30,
        what="beta restarted",
    )
    assert "--context-length 2048" in " ".join(box.daemon.engines()["beta"]["argv"])


def test_add_then_remove_leaves_the_file_as_it_was(
    box: Box, capsys: pytest.CaptureFixture[str]
) -> None:
    before = box.models.read_text()
    gamma = sim_model("gamma")
    env = json.dumps(gamma["kt"]["extra_env"])
    code, out, err = ktctl(
        capsys, box, "config", "add", "gamma", f"path={gamma['path']}", "numa=none",
        f"kt.kt_weight_path={gamma['kt']['kt_weight_path']}", f"kt.extra_env={env}", "--yes",
    )  # fmt: skip
    assert code == 0, err
    assert "gamma  add" in out
    assert "gamma" in box.daemon.engines()
    code, out, err = ktctl(capsys, box, "config", "remove", "gamma", "--yes")
    assert code == 0, err
    assert box.models.read_text() == before
    wait_for(lambda: "gamma" not in box.daemon.engines(), what="gamma gone")


def test_set_adds_and_takes_out_one_flag_and_says_when_a_list_is_replaced(
    box: Box, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 43: ``kt.extra_args=X`` silently replaced the whole list and nothing added
    one flag. ``+=`` appends, ``-=`` takes a flag out with its values, and the plan of an
    ``=`` that drops flags says "replaced" and which."""

    def args() -> list[str]:
        return list(json.loads(box.models.read_text())[0]["kt"]["extra_args"])

    code, out, err = ktctl(
        capsys, box, "config", "set", "alpha", "kt.extra_args+=--enable-metrics",
        "kt.extra_args+=--kt-method AMXINT4", "--yes",
    )  # fmt: skip
    assert code == 0, err
    assert args() == ["--enable-metrics", "--kt-method", "AMXINT4"]
    assert "replaced" not in out
    code, out, err = ktctl(capsys, box, "config", "set", "alpha", "kt.extra_args-=--kt-method",
                           "--yes")  # fmt: skip
    assert code == 0, err
    assert args() == ["--enable-metrics"]
    code, out, err = ktctl(capsys, box, "config", "set", "alpha",
                           "kt.extra_args=--kt-method=AMXINT4", "--yes")  # fmt: skip
    assert code == 0, err
    assert 'kt.extra_args replaced: ["--enable-metrics"] -> ["--kt-method=AMXINT4"]' in out
    assert "(drops --enable-metrics; adds --kt-method=AMXINT4)" in out
    before = box.files()
    code, _, err = ktctl(capsys, box, "config", "set", "alpha", "kt.extra_args-=--nope", "--yes")
    assert code == 2 and "alpha: kt.extra_args has no --nope" in err
    code, _, err = ktctl(capsys, box, "config", "set", "alpha", "ttl+=5", "--yes")
    assert code == 2 and "ttl is set whole with ttl=VALUE" in err
    assert box.files() == before


def test_plan_and_apply_a_whole_file_and_stdin(
    box: Box, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    doc = json.loads(box.models.read_text())
    doc[0]["max_concurrent"] = 4
    path = tmp_path / "models.json"
    path.write_text(json.dumps(doc))
    before = box.files()
    code, out, _ = ktctl(capsys, box, "config", "plan", str(path))
    assert code == 0 and "alpha  update" in out and "max_concurrent null -> 4" in out
    assert box.files() == before  # a plan changes nothing
    code, out, err = ktctl(capsys, box, "config", "apply", str(path), "--yes")
    assert code == 0, err
    assert box.models.read_text() == path.read_text()  # the user's text, as given
    doc[0]["max_concurrent"] = 8
    monkeypatch.setattr(sys, "stdin", _Stdin(json.dumps(doc, indent=4)))
    code, out, err = ktctl(capsys, box, "config", "apply", "-", "--yes", "--json")
    assert code == 0, err
    assert json.loads(out)["applied"] is True
    assert box.daemon.engines()["alpha"]["max_concurrent"] == 8


class _Stdin:
    def __init__(self, text: str) -> None:
        self.text = text

    def read(self) -> str:
        return self.text


def test_a_hand_edit_seen_at_reload_is_a_version_and_rollback_undoes_it(
    box: Box, capsys: pytest.CaptureFixture[str]
) -> None:
    before = box.models.read_text()
    doc = json.loads(before)
    doc[1]["ttl"] = 120
    box.models.write_text(json.dumps(doc, indent=2) + "\n")
    with box.client() as c:
        assert c.config_get().version != c.config_history().running  # not reloaded yet
        c.reload()
        newest = c.config_history().versions[0]
    assert (newest.how, newest.uid) == ("reload", os.getuid())
    code, out, err = ktctl(capsys, box, "config", "rollback", "--yes")
    assert code == 0, err
    assert "beta   update" in out and "ttl 120 -> 600" in out
    assert box.models.read_text() == before
    code, out, _ = ktctl(capsys, box, "config", "history")
    assert f"rollback of #{newest.seq - 1}" in out
    assert box.daemon.engines()["beta"]["ttl"] == 600


def test_edit_opens_the_editor_on_a_copy_and_plans_it_on_save(box: Box, tmp_path: Path) -> None:
    script = tmp_path / "editor.py"
    script.write_text(
        "import json, sys\n"
        "path = sys.argv[1]\n"
        "doc = json.load(open(path))\n"
        "doc[0]['sleep_ttl'] = 0\n"
        "doc[0]['fit'] = 'ignore'\n"
        "open(path, 'w').write(json.dumps(doc, indent=2) + '\\n')\n"
    )
    env = {**box.daemon.env, "EDITOR": f"{sys.executable} {script}"}
    r = subprocess.run(
        [sys.executable, "-m", "ktctl", "--socket", box.socket, "config", "edit", "--yes"],
        env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "alpha  update" in r.stdout and 'fit "check" -> "ignore"' in r.stdout
    assert json.loads(box.models.read_text())[0]["fit"] == "ignore"


def test_without_yes_and_without_a_terminal_nothing_is_applied(box: Box) -> None:
    before = box.files()
    r = subprocess.run(
        [sys.executable, "-m", "ktctl", "--socket", box.socket, "config", "set", "alpha", "ttl=5"],
        env=box.daemon.env, capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL, start_new_session=True,  # no controlling terminal
    )  # fmt: skip
    assert r.returncode == 2
    assert "alpha  update" in r.stdout  # the plan is shown
    assert "not applied: no terminal to ask on; pass --yes" in r.stderr
    assert box.files() == before


# ---------------------------------------------------------------- bad input


def _entry_text(box: Box, change: dict[str, Any], index: int = 0) -> str:
    doc = json.loads(box.models.read_text())
    doc[index].update(change)
    return json.dumps(doc, indent=2)


BAD_FILES = [
    ("unknown field", {"ttll": 30}, "$[0]: Object contains unknown field `ttll`"),
    ("wrong type", {"ttl": "soon"}, "$[0].ttl: Expected `float`, got `str`"),
    ("alias clash", {"alias": "beta"}, "$[1].alias: duplicate alias 'beta'"),
    ("path missing", {"path": "/no/m"}, "$[0].path: model_path /no/m does not exist"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "change", "message"), BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_a_bad_file_is_refused_naming_the_field(
    box: Box,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    what: str,
    change: dict[str, Any],
    message: str,
) -> None:
    path = tmp_path / "models.json"
    path.write_text(_entry_text(box, change))
    before, running = box.files(), box.running()
    code, _out, err = ktctl(capsys, box, "config", "apply", str(path), "--yes")
    assert code == 1
    assert err.startswith(f"ktctl: config_error: {box.models}: {message}"), err
    assert "nothing was changed" in err
    assert (box.files(), box.running()) == (before, running)


BAD_SETS = [
    ("unknown field", ["ttll=3"], 2,
     "usage: ttll: not a field of a models.json entry (did you mean ttl?)"),
    ("wrong type", ["ttl=soon"], 2, "usage: ttl: expected a number of seconds, got 'soon'"),
    ("weights missing", ["kt.kt_weight_path=/no/w"], 1,
     "config_error: {models}: $[0].kt.kt_weight_path: kt_weight_path /no/w does not exist"),
    ("flag SGLang refuses", ["kt.extra_args=--no-such-flag 1"], 1,
     "config_error: {models}: $[0].kt.extra_args: extra_args --no-such-flag: not an option of "
     "sglang-kt 0.7.2+sim"),
    ("ambiguous flag", ["kt.extra_args=--kt 1"], 1,
     "config_error: {models}: $[0].kt.extra_args: extra_args --kt: ambiguous option"),
    ("value SGLang refuses", ["kt.extra_args=--dtype float7"], 1,
     "config_error: {models}: $[0].kt.extra_args: extra_args --dtype: invalid choice 'float7'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("what", "words", "code", "message"), BAD_SETS, ids=[b[0] for b in BAD_SETS]
)
def test_a_bad_set_is_refused_naming_the_field(
    box: Box,
    capsys: pytest.CaptureFixture[str],
    what: str,
    words: list[str],
    code: int,
    message: str,
) -> None:
    before, running = box.files(), box.running()
    got, _out, err = ktctl(capsys, box, "config", "set", "alpha", *words, "--yes")
    assert got == code
    assert err.startswith("ktctl: " + message.format(models=box.models)), err
    assert (box.files(), box.running()) == (before, running)


def test_an_alias_clash_by_add_is_refused(box: Box, capsys: pytest.CaptureFixture[str]) -> None:
    before = box.files()
    code, _, err = ktctl(capsys, box, "config", "add", "beta", "path=/m", "--yes")
    assert code == 1 and "an entry with alias 'beta' is there already" in err
    assert box.files() == before


def test_a_stale_base_is_refused(
    box: Box, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "models.json"
    path.write_text(_entry_text(box, {"ttl": 7}))
    before = box.files()
    code, _, err = ktctl(
        capsys, box, "config", "apply", str(path), "--base", "0123456789ab", "--yes"
    )
    assert code == 1
    assert "stale_config: the config changed since version 0123456789ab was read" in err
    assert box.files() == before
    # Even a text that would change nothing: the version read is not what is there.
    code, _, err = ktctl(
        capsys, box, "config", "apply", str(box.models), "--base", "0123456789ab", "--yes"
    )
    assert code == 1 and "stale_config: the config changed since version 0123456789ab" in err


def test_a_change_that_would_throw_a_load_away_is_refused(
    box: Box, capsys: pytest.CaptureFixture[str]
) -> None:
    with box.client() as c:
        c.load("slow", wait=False)
        pid = wait_for(lambda: box.daemon.engines()["slow"]["pid"], what="slow launched")
        before, running = box.files(), box.running()
        code, _, err = ktctl(capsys, box, "config", "set", "slow", "kt.ctx=1024", "--yes")
        assert code == 1
        assert err.startswith("ktctl: busy: slow is loading (loading): this change would restart")
        assert (box.files(), box.running()) == (before, running)
        assert box.daemon.engines()["slow"]["pid"] == pid  # the load goes on
        # What does not touch the load goes ahead meanwhile.
        code, _out, err = ktctl(capsys, box, "config", "set", "slow", "ttl=900", "--yes")
        assert code == 0, err
        assert box.daemon.engines()["slow"]["pid"] == pid
        c.evict("slow", force=True)


def test_two_writers_at_once_one_wins(box: Box) -> None:
    base = box.version()
    texts = [_entry_text(box, {"ttl": 11}), _entry_text(box, {"ttl": 12})]
    results: list[Any] = [None, None]

    def write(i: int) -> None:
        with box.client() as c:
            try:
                results[i] = c.config_apply(models_text=texts[i], base=base)
            except KtdError as exc:
                results[i] = exc

    threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    won = [r for r in results if isinstance(r, p.ConfigApplyReply)]
    lost = [r for r in results if isinstance(r, KtdError)]
    assert len(won) == 1 and [e.code for e in lost] == ["stale_config"]
    assert box.models.read_text() == texts[results.index(won[0])]


# ---------------------------------------------------------------- a full disk


def test_a_full_disk_leaves_the_files_and_the_running_config(tmp_path: Path) -> None:
    """The config lives on a 64 KiB tmpfs (a mount namespace of the daemon's own: no
    root needed with a user namespace, nothing to unmount), nearly full: the apply of a
    bigger models.json is refused, and the files and the running config stay."""
    root = Path(tempfile.mkdtemp(prefix="ktd-full-", dir="/tmp"))
    try:
        src = write_config(root / "src", [sim_model("alpha")])
        etc = root / "etc"
        etc.mkdir()
        script = (
            f"mount -t tmpfs -o size=64k tmpfs {etc} && cp {src.parent}/*.json {etc}/ && "
            f'head -c 40000 /dev/zero > {etc}/filler && exec "$@"'
        )
        unshare = ["unshare", "--mount", "--propagation", "private"]
        if os.geteuid() != 0:
            unshare.append("--map-root-user")
        daemon = DaemonProc(
            config=etc / "config.json", env=box_env(root), log_path=root / "ktd.log"
        )
        cmd = [sys.executable, "-m", "ktd", "serve", "--config", str(etc / "config.json")]
        log = open(daemon.log_path, "ab")  # noqa: SIM115
        daemon.proc = subprocess.Popen(
            [*unshare, "sh", "-c", script, "sh", *cmd],
            env=daemon.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        log.close()
        try:
            daemon.wait_ready()
            with daemon.client() as c:
                got = c.config_get()
                doc = json.loads(got.models_text or "")
                doc[0]["kt"]["extra_env"]["PADDING"] = "x" * 30000  # more than is left
                with pytest.raises(KtdError) as info:
                    c.config_apply(models_text=json.dumps(doc, indent=2), base=got.version)
                assert info.value.code == "write_failed"
                assert "No space left on device" in info.value.message
                assert "nothing was changed" in info.value.message
                again = c.config_get()
                assert (again.version, again.models_text) == (got.version, got.models_text)
                assert c.config_history().running == got.version
                assert [v.seq for v in c.config_history().versions] == [1]
                assert "PADDING" not in json.dumps(c.status()[0].argv)
        finally:
            daemon.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_an_unknown_model_is_exit_4_and_says_where_the_section_model_is(
    box: Box, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = ktctl(capsys, box, "config", "set", "nope", "ttl=1", "--yes")
    assert code == 4
    assert "no entry with alias 'nope' in models.json (there are: alpha, beta, slow)" in err
    assert "ktctl config edit --file config" in err
