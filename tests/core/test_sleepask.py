"""What ``ktctl sleep`` and ``ktctl wake`` are answered (``ktd.core.sleepask``, issue 45:
the sleep requests' rules out of the pool): who may be asked, when a sleep's wait is over,
what its end means, over every state and desire an engine can report."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ktd.core import sleepask as A
from ktd.core import states as S
from ktd.core.lifecycle_io import Want
from ktd.protocol import ErrorCode

states = st.sampled_from(list(S.State))
wants = st.sampled_from(list(Want))


def test_an_engine_without_sleep_in_its_entry_cannot_be_asked() -> None:
    r = A.cannot_sleep("m", "off", None)
    assert r is not None and r.code == ErrorCode.NO_SLEEP and r.detail == {"sleep": "off"}
    assert '"sleep": true' in r.message


def test_an_sglang_without_memory_saver_is_named() -> None:
    r = A.cannot_sleep("m", "unsupported", "SGLang 0.4.6")
    assert r is not None and r.code == ErrorCode.NO_SLEEP
    assert "SGLang 0.4.6 has no --enable-memory-saver" in r.message
    unnamed = A.cannot_sleep("m", "unsupported", None)
    assert unnamed is not None and "its SGLang has no" in unnamed.message
    assert A.cannot_sleep("m", "on", None) is None


@given(states, st.booleans())
def test_only_a_running_engine_can_be_put_to_sleep(state: S.State, want_up: bool) -> None:
    refused = A.sleep_refused("m", state)
    running = state in (S.READY, S.STARTING, S.WAKING, S.SLEEPING)
    assert (refused is None) == running
    if refused is not None:
        assert refused.code == ErrorCode.NOT_LOADED and refused.detail == {"state": state}
    assert A.asleep_already(state, want_up) == (state == S.ASLEEP and not want_up)


@given(states, wants)
def test_the_wait_ends_at_rest_or_when_the_desire_changed(state: S.State, want: Want) -> None:
    over = A.sleep_over(state, want)
    if want != Want.ASLEEP:
        assert over
    else:
        assert over == (state in (S.ASLEEP, S.STOPPED, S.FAILED))


@given(states, wants, st.sampled_from([None, "", "drain did not reach zero in 5s"]))
def test_a_sleep_ends_asleep_or_says_why_not(
    state: S.State, want: Want, reason: str | None
) -> None:
    end = A.sleep_end("m", state, want, reason)
    if state == S.ASLEEP:
        assert end is None
        return
    assert end is not None and end.detail == {"state": state}
    if want == Want.UP:
        assert end.code == ErrorCode.BUSY and "stays up" in end.message
    elif reason and state in (S.STOPPING, S.STOPPED, S.FAILED):
        assert end.code == ErrorCode.LOAD_FAILED and end.message.endswith(reason)
    else:
        assert end.code == ErrorCode.LOAD_FAILED and "overtaken by an evict" in end.message


@given(states, st.booleans(), st.booleans())
def test_a_wake_of_an_engine_not_asleep_is_a_load(
    state: S.State, want_up: bool, sleeps: bool
) -> None:
    no_sleep = None if sleeps else A.cannot_sleep("m", "off", None)
    refused = A.wake_refused("m", state, no_sleep)
    if state in (S.ASLEEP, S.SLEEPING, S.WAKING):
        assert refused is None
    elif not sleeps:
        assert refused is no_sleep  # it cannot sleep at all: that, not "load it"
    else:
        assert refused is not None and refused.code == ErrorCode.NOT_LOADED
        assert "`ktctl load m` loads it" in refused.message
    assert A.awake_already(state, want_up) == (state == S.READY and want_up)
