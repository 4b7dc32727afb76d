"""Keys kept hashed: loading from the configuration, lookup, names."""

from __future__ import annotations

import hashlib

import pytest

from duplex_gateway.auth.keys import ApiKey, KeyStore, hash_key
from duplex_gateway.auth.principal import ALL_SCOPES, Scope
from duplex_gateway.config import ConfigError, load_settings


def test_hash_key_is_sha256_hex() -> None:
    assert hash_key("sk-1") == "sha256:" + hashlib.sha256(b"sk-1").hexdigest()


def test_plaintext_keys_are_hashed_at_load_and_never_kept() -> None:
    settings = load_settings(
        None, **{"auth.keys": [{"name": "web", "key": "sk-plain-secret", "scopes": ["realtime"]}]}
    )
    (entry,) = settings.auth.keys
    assert entry.hash == hash_key("sk-plain-secret")
    assert "sk-plain-secret" not in repr(settings) and "sk-plain-secret" not in settings.model_dump_json()
    assert entry.hash not in repr(settings)  # not even the hash is printed


def test_bad_key_entries_are_refused_without_showing_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(None, **{"auth.keys": [{"name": "web", "key": "sk-shown?", "hash": hash_key("x")}]})
    assert "not both" in str(info.value) and "sk-shown?" not in str(info.value)
    for entry in (
        {"name": "web"},  # neither
        {"name": "has space", "key": "k"},
        {"name": "web", "hash": "sha256:abc"},
        {"name": "web", "key": "k", "scopes": ["everything"]},
        {"name": "web", "key": "k", "max_sessions": 0},
    ):
        with pytest.raises(ConfigError):
            load_settings(None, **{"auth.keys": [entry]})
    with pytest.raises(ConfigError, match="same name"):
        load_settings(None, **{"auth.keys": [{"name": "a", "key": "1"}, {"name": "a", "key": "2"}]})
    with pytest.raises(ConfigError, match="same hash"):
        load_settings(None, **{"auth.keys": [{"name": "a", "key": "1"}, {"name": "b", "key": "1"}]})


def test_store_from_settings_with_the_older_api_keys() -> None:
    settings = load_settings(
        None,
        **{
            "auth.keys": [
                {
                    "name": "web",
                    "key": "sk-web",
                    "scopes": ["realtime", "client_secrets"],
                    "engines": ["echo"],
                    "max_sessions": 3,
                },
            ],
            "auth.api_keys": ["sk-old", "sk-web"],  # one also listed in keys: keys wins
        },
    )
    store = KeyStore.from_settings(settings.auth)
    assert store.enabled and len(store) == 2
    web = store.find("sk-web")
    assert web is not None and web.name == "web" and web.max_sessions == 3
    assert web.scopes == {Scope.REALTIME, Scope.CLIENT_SECRETS} and web.engines == {"echo"}
    old = store.find("sk-old")
    assert old is not None and old.scopes == ALL_SCOPES and old.max_sessions is None
    assert old.name == "key-" + hashlib.sha256(b"sk-old").hexdigest()[:8]
    assert store.named("web") is web and store.named(old.name) is old
    assert store.find("sk-other") is None and store.find("") is None
    assert "sk-web" not in repr(web) and web.digest.hex() not in repr(web)


def test_no_keys_means_no_authentication() -> None:
    assert not KeyStore.from_settings(load_settings(None).auth).enabled


def test_engines() -> None:
    key = ApiKey(name="k", digest=b"\0" * 32, engines=frozenset({"remote"}))
    assert key.for_engine("remote") and not key.for_engine("echo")
    assert ApiKey(name="any", digest=b"\0" * 32).for_engine("echo")


def test_each_of_many_keys_is_found() -> None:
    store = KeyStore.from_plaintext(["a", "b", "c", "a"])  # a repeated key is one key
    found = [store.find(k) for k in "abc"]
    assert len(store) == 3 and len({k.name for k in found if k is not None}) == 3
