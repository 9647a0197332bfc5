"""Read the small text fields of a ``multipart/form-data`` body without copying the files.

Why here and this small: the frontend must route ``/v1/audio/transcriptions``
by its ``model`` form field and then forward the body untouched, and the sim
must read the same fields SGLang's FastAPI ``Form`` would. Both only need the
named text parts; file parts are sized, never decoded. Pure, stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass


class MultipartError(ValueError):
    """Not a multipart body we can read (no boundary, no closing delimiter)."""


@dataclass(frozen=True)
class Part:
    name: str
    filename: str | None
    content_type: str | None
    data: bytes


def boundary_of(content_type: str) -> str:
    """The ``boundary`` parameter of a Content-Type, or MultipartError."""
    kind, _, params = content_type.partition(";")
    if kind.strip().lower() != "multipart/form-data":
        raise MultipartError("not multipart/form-data")
    for param in params.split(";"):
        key, _, value = param.strip().partition("=")
        if key.lower() == "boundary" and value:
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            if value:
                return value
    raise MultipartError("multipart/form-data without a boundary")


def _disposition(value: str) -> tuple[str | None, str | None]:
    name = filename = None
    for item in value.split(";")[1:]:
        key, _, val = item.strip().partition("=")
        val = val.strip()
        if len(val) >= 2 and val[0] == val[-1] == '"':
            val = val[1:-1]
        if key.lower() == "name":
            name = val
        elif key.lower() == "filename":
            filename = val
    return name, filename


def parts(body: bytes, content_type: str) -> list[Part]:
    """Every part of the body, in order."""
    delim = b"--" + boundary_of(content_type).encode("latin-1")
    chunks = body.split(delim)
    if len(chunks) < 3:
        raise MultipartError("multipart body has no parts or no closing delimiter")
    out: list[Part] = []
    for chunk in chunks[1:]:
        if chunk.startswith(b"--"):
            return out  # the closing delimiter
        head, sep, data = chunk.partition(b"\r\n\r\n")
        if not sep:
            raise MultipartError("multipart part without a header block")
        name = filename = ctype = None
        for line in head.decode("latin-1").split("\r\n"):
            key, _, value = line.partition(":")
            if key.strip().lower() == "content-disposition":
                name, filename = _disposition(value)
            elif key.strip().lower() == "content-type":
                ctype = value.strip()
        if data.endswith(b"\r\n"):
            data = data[:-2]
        if name is not None:
            out.append(Part(name, filename, ctype, data))
    raise MultipartError("multipart body without a closing delimiter")


def text_field(body: bytes, content_type: str, name: str) -> str | None:
    """The value of form field ``name`` (not a file), or None when absent."""
    for part in parts(body, content_type):
        if part.name == name and part.filename is None:
            return part.data.decode("utf-8", "replace")
    return None
