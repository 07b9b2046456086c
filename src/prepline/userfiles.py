"""Small files a transform's parameters name (block lists, evaluation sets): local paths,
``file://`` or ``s3://`` URIs, read whole, with an error that names the parameter and the file."""

from __future__ import annotations

import os

from prepline.data_access import open_location, scheme_of
from prepline.errors import ConfigError, PreplineError


def _split(uri: str) -> tuple[str, str]:
    head, _, name = uri.rstrip("/").rpartition("/")
    return head, name


def check_file(uri: str, what: str, fix: str) -> None:
    """Fail fast when ``uri`` is not a readable file (``what`` names the parameter, e.g. ``domain_lists``)."""
    if not uri.strip():
        raise ConfigError(f"{what} has an empty file name", fix)
    if scheme_of(uri):
        try:
            size = open_location(uri).file_size()
        except PreplineError as e:
            raise ConfigError(f"{what}: {uri} cannot be read ({e.message})", fix) from None
        if size is None:
            raise ConfigError(f"{what}: {uri} does not exist", fix)
        return
    path = uri[len("file://"):] if uri.lower().startswith("file://") else uri
    if not os.path.isfile(path):
        raise ConfigError(f"{what}: {uri} is not a file", fix)


def read_file(uri: str, what: str, fix: str) -> bytes:
    """The bytes of the file ``uri`` (local or remote)."""
    check_file(uri, what, fix)
    if scheme_of(uri):
        head, name = _split(uri)
        try:
            return open_location(head).read_bytes(name)
        except PreplineError as e:
            raise ConfigError(f"{what}: {uri} cannot be read ({e.message})", fix) from None
    path = uri[len("file://"):] if uri.lower().startswith("file://") else uri
    with open(path, "rb") as f:
        return f.read()


def read_lines(uri: str, what: str, fix: str) -> list[str]:
    """The non-empty lines of a UTF-8 list file, without ``#`` comment lines, stripped."""
    data = read_file(uri, what, fix)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{what}: {uri} is not UTF-8 text", fix) from None
    return [s for s in (line.strip() for line in text.splitlines()) if s and not s.startswith("#")]
