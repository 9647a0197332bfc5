"""Plain API keys (``ktd.frontend.auth``)."""

from __future__ import annotations

import pytest

from ktd.frontend.auth import ApiKeys
from ktd.frontend.errors import ApiError


def test_api_keys() -> None:
    ApiKeys([]).check(None)  # no keys: open
    keys = ApiKeys(["sk-one", "sk-two", "sk-ü"])
    keys.check(b"Bearer sk-two")
    keys.check("bearer sk-one")
    keys.check("Bearer sk-ü".encode())
    for bad, code in [
        (None, "missing_api_key"),
        (b"", "missing_api_key"),
        (b"Basic c2stb25l", "missing_api_key"),
        (b"Bearer", "missing_api_key"),
        (b"Bearer sk-three", "invalid_api_key"),
        (b"Bearer \xff\xfe", "invalid_api_key"),
        ("Bearer sk-ü-not".encode(), "invalid_api_key"),
    ]:
        with pytest.raises(ApiError) as info:
            keys.check(bad)
        assert info.value.status == 401
        assert info.value.code == code
        assert b"sk-" not in info.value.body()  # never echo a key


def test_a_request_s_key_is_read_from_its_authorization_header() -> None:
    keys = ApiKeys(["sk-one"])
    scope = {"headers": [(b"x-other", b"1"), (b"authorization", b"Bearer sk-one")]}
    assert keys.of(scope) is not None and ApiKeys([]).of({"headers": []}) is None
    with pytest.raises(ApiError) as err:
        keys.of({"headers": []})
    assert err.value.status == 401
