"""An engine's API key (issue 32): how it is given (``keying``), kept (``KeyDir``) and hidden
from the engine's log (``EngineLog.redact``), file and tail alike."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from ktd.core.command import LaunchError, key_file_of, keyed_launch, keying, with_key_file
from ktd.core.config import ModelSpec
from ktd.core.sglang_options import CatalogData, SGLangOptions
from ktd.daemon.engine.key import KeyDir, admin_key_of_argv, key_of_argv, new_key, read_key
from ktd.daemon.engine.log import EngineLog
from ktd.sim import flags

KEY = "f00d" * 16


def catalog(which: str = "kt", drop: tuple[str, ...] = ()) -> SGLangOptions:
    data = dict(flags.catalog(which))
    data["options"] = [o for o in data["options"] if not set(o["flags"]) & set(drop)]
    data["package"] = "sglang-kt" if which == "kt" else "sglang"
    return SGLangOptions.from_data(msgspec.convert(data, CatalogData))


def spec(*extra: str) -> ModelSpec:
    return ModelSpec(
        alias="m", backend="kt", path="/m", served=True, source="t", python="/py", extra_args=extra
    )


# ---------------------------------------------------------------- keying (pure)


@pytest.mark.parametrize("which", ["kt", "upstream"])
def test_an_engine_gets_a_key_file_when_its_sglang_reads_one(which: str) -> None:
    got = keying(spec(), catalog(which))
    assert got.config and got.user_key is None and got.note is None
    argv = with_key_file(["python", "-m", "sglang.launch_server"], "/s/keys/m.yml")
    assert argv[-2:] == ["--config", "/s/keys/m.yml"] and key_file_of(argv) == "/s/keys/m.yml"


def test_the_users_own_key_goes_in_the_key_file_off_the_command_line() -> None:
    """Issue 32's leftover: a user's ``--api-key`` (however argparse reads it) is taken
    out of the argv, every other flag kept in place, and written in the 0600 file."""
    got = keying(spec("--trust-remote-code", "--api-key", "mine", "--tp", "1"), catalog())
    assert got.config and got.user_key == "mine" and got.note is None
    assert got.extra_args == ("--trust-remote-code", "--tp", "1")
    assert keying(spec("--api-k=mine2"), catalog()).extra_args == ()  # argparse's prefix
    twice = keying(spec("--api-key", "a", "--api-key", "b"), catalog())
    assert twice.user_key == "b" and twice.extra_args == ()  # the last wins, both go
    command, keyed = keyed_launch(spec("--api-key", "mine", "--tp", "1"), 30000, (), catalog())
    assert "mine" not in command.argv and command.argv[-2:] == ["--tp", "1"]
    assert keyed.user_key == "mine"


def test_the_users_admin_key_goes_in_the_key_file_and_ktd_carries_it(tmp_path: Path) -> None:
    """Issue 40: with ``--admin-api-key`` SGLang's release, resume, pause, continue and
    flush want that key alone (a sleep's calls answered 401). It leaves the command line
    for the 0600 file, beside the API key, and ktd keeps it for those calls."""
    got = keying(spec("--admin-api-key", "adm", "--tp", "1"), catalog())
    assert got.config and got.admin_key == "adm" and got.user_key is None and got.note is None
    assert got.extra_args == ("--tp", "1")
    both = keying(spec("--api-key", "k", "--admin-api-key=adm"), catalog())
    assert both.user_key == "k" and both.admin_key == "adm" and both.extra_args == ()
    path = KeyDir(tmp_path / "keys").write("m", "k", admin_key="adm")
    argv = with_key_file(["python", "-m", "sglang.launch_server"], str(path))
    assert admin_key_of_argv(argv) == "adm" and key_of_argv(argv)[0] == "k"
    # Where no file can carry it, it stays on the command line, and ktd still sends it.
    stays = keying(spec("--admin-api-key", "adm"), catalog(drop=("--config",)))
    assert stays.admin_key == "adm" and stays.extra_args is None
    assert stays.note is not None and "--admin-api-key from extra_args" in stays.note
    assert admin_key_of_argv(["x", "--admin-api-key", "adm"]) == "adm"


@pytest.mark.parametrize(
    ("extra", "cat"),
    [
        (("--api-key", "x"), None),  # no catalogue: as written
        (("--api-key", "mine"), "no-config"),  # an SGLang that reads no --config
        (("--api-key=-dash",), "kt"),  # SGLang's merge would take "-dash" for a flag
    ],
)
def test_the_users_key_stays_on_the_command_line_where_no_file_can_carry_it(
    extra: tuple[str, ...], cat: str | None
) -> None:
    found = None if cat is None else catalog(drop=("--config",) if cat == "no-config" else ())
    got = keying(spec(*extra), found)
    assert not got.config and got.extra_args is None and got.user_key is not None
    assert got.note is not None and "readable by every local user" in got.note


def test_a_users_config_file_is_refused_and_an_old_sglang_runs_without_a_key() -> None:
    with pytest.raises(LaunchError, match="config file of its own"):
        keying(spec("--config", "/etc/mine.yaml"), catalog())
    old = keying(spec(), catalog(drop=("--config",)))
    assert not old.config and old.note is not None and "answers every local user" in old.note
    many = keying(spec("--tokenizer-worker-num", "2"), catalog())  # SGLang asserts no key then
    assert not many.config and many.note is not None and "tokenizer-worker-num" in many.note


# ---------------------------------------------------------------- the key file


def test_the_key_file_is_0600_in_a_0700_dir_read_back_and_swept(tmp_path: Path) -> None:
    keys = KeyDir(tmp_path / "state" / "keys")
    key = new_key()
    assert len(key) == 64 and not key.startswith("-")
    path = keys.write("m", key)
    assert path == tmp_path / "state" / "keys" / "m.yml"
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    assert read_key(path) == key
    odd = 'a "quoted" key: with # and \\ and ü'
    assert read_key(keys.write("q", odd)) == odd  # a user's key, whatever it holds
    KeyDir.remove(keys.file_for("q"))
    assert key_of_argv(["py", "--port", "1", "--config", str(path)]) == (key, path)
    assert key_of_argv(["py", "--api-key", "u"]) == ("u", None)
    other = keys.write("n", new_key())
    (keys.path / ".tmp-dead.yml").write_text("x")  # a write cut short
    assert sorted(p.name for p in keys.sweep([path])) == [".tmp-dead.yml", "n.yml"]
    assert path.exists() and not other.exists()
    KeyDir.remove(path)
    KeyDir.remove(path)  # gone already: fine
    assert not path.exists() and read_key(path) is None


def test_a_key_dir_others_may_write_to_is_refused(tmp_path: Path) -> None:
    from ktd.daemon.safedir import UnsafeDir

    d = tmp_path / "keys"
    d.mkdir(mode=0o777)
    os.chmod(d, 0o777)
    with pytest.raises(UnsafeDir):
        KeyDir(d).write("m", KEY)


# ---------------------------------------------------------------- the log


def engine_writes(path: Path, *chunks: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        for c in chunks:
            os.write(fd, c)
    finally:
        os.close(fd)


def test_the_key_is_masked_in_the_file_the_tail_and_the_events(tmp_path: Path) -> None:
    published: list[str] = []
    log = EngineLog(tmp_path / "m.log", publish=published.extend)
    fd = log.open_for_engine()
    assert fd is not None
    os.close(fd)
    log.redact(KEY)
    log.start_following(from_end=False)
    line = f"server_args=ServerArgs(port=1, api_key='{KEY}', x=2)\n".encode()
    # Split mid-key across two reads, as a slow writer would.
    engine_writes(log.path, line[:40])
    assert log.poll() == []
    engine_writes(log.path, line[40:], b"ready\n")
    lines = log.poll()
    masked = f"server_args=ServerArgs(port=1, api_key='{'*' * 64}', x=2)"
    assert lines == [masked, "ready"] and published == lines
    assert log.last(5) == [masked, "ready"]
    on_disk = log.path.read_bytes()
    assert KEY.encode() not in on_disk and masked.encode() in on_disk
    assert len(on_disk) == len(line) + len(b"ready\n")  # masked in place, nothing moved
    # Written to the engine's own fd later on: masked in the file as it is read.
    engine_writes(log.path, f"again {KEY}\n".encode())
    assert log.poll() == [f"again {'*' * 64}"]
    assert KEY.encode() not in log.path.read_bytes()
    log.stop_following()


def test_the_key_is_masked_in_the_pipe_fallback_and_after_rotation(tmp_path: Path) -> None:
    log = EngineLog(tmp_path / "m.log", max_bytes=200, backups=1)
    log.redact(KEY)
    assert log.feed(f"a {KEY} b\n".encode()) == [f"a {'*' * 64} b"]  # the pipe: memory only
    fd = log.open_for_engine()
    assert fd is not None
    os.close(fd)
    log.start_following(from_end=False)
    for i in range(4):
        engine_writes(log.path, f"{i} api_key='{KEY}'\n".encode())
        log.poll()
    log.stop_following()
    for path in (log.path, log.path.with_name("m.log.1")):
        assert KEY.encode() not in path.read_bytes()
    assert all(KEY not in line for line in log.last(10))
