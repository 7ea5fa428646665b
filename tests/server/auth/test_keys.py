"""API keys: the environment variable and the key file, matching, the loopback rule without a key."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnivoice.config import AuthConfig
from omnivoice.server.auth.keys import (
    ApiKeys,
    KeyConfigError,
    UnsafeBind,
    check_bind,
    is_loopback,
    key_id,
)


def test_keys_from_the_environment_and_the_key_file(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# team keys\nsk-file-one\n\n  sk-file-two   # the CI's\nsk-env-a\n")
    keys = ApiKeys.load(AuthConfig(api_key_file=str(path)), {"OMNIVOICE_API_KEY": " sk-env-a, sk-env-b ,"})
    assert len(keys) == 4  # a key in both places counts once
    for key in ("sk-env-a", "sk-env-b", "sk-file-one", "sk-file-two"):
        assert keys.match(key) == key_id(key)
    assert keys.match("sk-env") is None and keys.match("sk-env-a ") is None and keys.match("") is None
    assert "sk-" not in repr(keys) and "4 keys" in repr(keys)


def test_no_keys_anywhere_is_falsy() -> None:
    keys = ApiKeys.load(AuthConfig(), {"OMNIVOICE_API_KEY": " , "})
    assert not keys and keys.match("anything") is None


@pytest.mark.parametrize(
    ("text", "needle"), [(None, "cannot read"), ("# only a comment\n\n", "holds no key")]
)
def test_a_bad_key_file_is_an_error(tmp_path: Path, text: str | None, needle: str) -> None:
    path = tmp_path / "keys"
    if text is not None:
        path.write_text(text)
    with pytest.raises(KeyConfigError, match=needle):
        ApiKeys.load(AuthConfig(api_key_file=str(path)), {})


def test_key_ids_name_a_key_without_revealing_it() -> None:
    kid = key_id("sk-secret-value")
    assert kid.startswith("key-") and len(kid) == 12 and "secret" not in kid
    assert kid == key_id("sk-secret-value") != key_id("sk-secret-valuf")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True), ("localhost", True),
     ("0.0.0.0", False), ("::", False), ("192.168.1.10", False), ("example.com", False)],
)  # fmt: skip
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_without_a_key_only_loopback_unless_explicitly_allowed() -> None:
    none, some = ApiKeys(), ApiKeys(["sk-x"])
    check_bind("127.0.0.1", none, AuthConfig())
    check_bind("0.0.0.0", some, AuthConfig())
    with pytest.raises(UnsafeBind, match="OMNIVOICE_API_KEY") as err:
        check_bind("0.0.0.0", none, AuthConfig())
    assert "--insecure-no-auth" in str(err.value) and "api_key_file" in str(err.value)
    check_bind("0.0.0.0", none, AuthConfig(), insecure=True)
    check_bind("0.0.0.0", none, AuthConfig(allow_unauthenticated_remote=True))
