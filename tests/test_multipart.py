"""Multipart form fields (``ktd.multipart``), read without touching the files."""

from __future__ import annotations

import pytest

from ktd import multipart


def test_multipart_fields_without_touching_files() -> None:
    body = (
        b'--XyZ\r\nContent-Disposition: form-data; name="model"\r\n\r\nm1\r\n'
        b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        b"Content-Type: audio/wav\r\n\r\n\x00\x01--\r\n\r\n"
        b"--XyZ--\r\n"
    )
    ctype = 'multipart/form-data; boundary="XyZ"'
    assert multipart.text_field(body, ctype, "model") == "m1"
    assert multipart.text_field(body, ctype, "file") is None  # a file, not a text field
    parts = {p.name: p for p in multipart.parts(body, ctype)}
    assert parts["file"].data == b"\x00\x01--\r\n" and parts["file"].content_type == "audio/wav"
    for bad in ("application/json", "multipart/form-data"):
        with pytest.raises(multipart.MultipartError):
            multipart.text_field(body, bad, "model")
    with pytest.raises(multipart.MultipartError):
        multipart.text_field(b"--XyZ\r\n", ctype, "model")
