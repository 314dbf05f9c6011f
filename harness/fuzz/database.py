"""Where fuzz runs keep their failures: a directory (the default) or a Redis server.

Several fuzz processes, on one machine or many, share failures through one database: each
replays what the others saved before it searches (Hypothesis's reuse phase), and a search
still running notices a failure saved by another (`SharedFailures`) and restarts so that its
reuse phase replays it at once. The Redis store is Hypothesis's own `RedisExampleDatabase`.
Each search sees the shared database through `KeyedDatabase`, under its own key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

from harness.errors import ConfigError

# A password, when the server wants one, comes from the environment, never the command line.
PASSWORD_VARIABLE = "HARNESS_REDIS_PASSWORD"
REDIS_TIMEOUT_S = 5.0  # bound on connecting to the server and on each command


@dataclass(frozen=True)
class RedisAddress:
    host: str
    port: int
    db: int

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"redis://{host}:{self.port}/{self.db}"


def is_url(text: str) -> bool:
    return "://" in text


def parse_redis_url(text: str) -> RedisAddress:
    """`redis://host:port/db` (port 6379 and db 0 when left out); anything else is a
    ConfigError naming `database`."""
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise ConfigError("database", f"{text!r} is not a redis:// URL ({exc})") from None
    if parts.scheme != "redis":
        raise ConfigError("database", f"{text!r}: scheme {parts.scheme!r} is not supported; "
                          "give a directory or redis://host:port/db")
    if parts.username or parts.password:
        raise ConfigError("database", f"credentials do not go on a command line; set "
                          f"{PASSWORD_VARIABLE} and give redis://host:port/db")
    if not parts.hostname:
        raise ConfigError("database", f"{text!r} names no host (redis://host:port/db)")
    if parts.query or parts.fragment:
        raise ConfigError("database", f"{text!r}: a query or fragment is not understood")
    path = unquote(parts.path).strip("/")
    if path and not path.isdigit():
        raise ConfigError("database", f"{text!r}: the database must be a number, got {path!r}")
    return RedisAddress(parts.hostname, 6379 if port is None else port, int(path or 0))


def open_database(text: str) -> ExampleDatabase:
    """The example database `text` names: a redis:// URL (the server must answer now) or a
    directory."""
    if not is_url(text):
        return DirectoryBasedExampleDatabase(text)
    address = parse_redis_url(text)
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError:
        raise ConfigError("database", "a redis:// database needs the redis package "
                          "(pip install -e '.[dev]' installs it)") from None
    client = redis.Redis(host=address.host, port=address.port, db=address.db,
                         password=os.environ.get(PASSWORD_VARIABLE) or None,
                         socket_connect_timeout=REDIS_TIMEOUT_S,
                         socket_timeout=REDIS_TIMEOUT_S)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise ConfigError("database", f"no Redis server answers at {address.url()}: "
                          f"{exc}") from None
    return RedisExampleDatabase(client)


def saved_failures(database: ExampleDatabase, key: bytes) -> set[bytes]:
    """The failing examples saved under a search's key, and those that led to them (the
    primary and secondary corpora Hypothesis replays first)."""
    return set(database.fetch(key)) | set(database.fetch(key + b".secondary"))


class SharedFailures:
    """Failures other processes saved under one search's key since it last looked."""

    def __init__(self, database: ExampleDatabase, key: bytes) -> None:
        self.database = database
        self.key = key
        self.seen: set[bytes] = set()

    def look(self) -> int:
        """Take what is saved now as seen; returns how many are saved."""
        self.seen = set(self.database.fetch(self.key))
        return len(saved_failures(self.database, self.key))

    def arrived(self) -> bool:
        """A failure that was not there at the last look (only the primary corpus: that is
        where a failure is saved once it is found). One round trip, asked before each world
        run, which costs milliseconds at least."""
        return bool(set(self.database.fetch(self.key)) - self.seen)


class KeyedDatabase(ExampleDatabase):
    """One search's view of a shared database: what Hypothesis keeps under its test's key is
    kept under the search's own key (`key`, `key.secondary`, ...) instead.

    The fuzzer's Hypothesis test is one function for every variant, so Hypothesis derives the
    same key for all of them; unmapped, a failure saved by one variant is replayed by the next.
    The first key asked for is the test's (the reuse phase fetches its failures first); the
    keys Hypothesis derives from it keep their suffix, and any other key is refused.
    """

    def __init__(self, inner: ExampleDatabase, key: bytes) -> None:
        super().__init__()
        self.inner = inner
        self.key = key
        self.test_key: bytes | None = None

    def _ours(self, key: bytes) -> bytes:
        if self.test_key is None:
            self.test_key = key
        if not key.startswith(self.test_key):
            raise RuntimeError(f"Hypothesis used key {key!r}, not derived from its test's key "
                               f"{self.test_key!r}: the search's key cannot map it")
        return self.key + key[len(self.test_key):]

    def fetch(self, key: bytes):
        return self.inner.fetch(self._ours(key))

    def save(self, key: bytes, value: bytes) -> None:
        self.inner.save(self._ours(key), value)

    def delete(self, key: bytes, value: bytes) -> None:
        self.inner.delete(self._ours(key), value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.inner.move(self._ours(src), self._ours(dest), value)


class StoppableDatabase(ExampleDatabase):
    """A database that ignores saves while the search is being stopped.

    Hypothesis saves the example of any exception that ends a test, so the signals that end
    a search (budget spent, a failure shared) would otherwise be saved as failures: replayed
    first by every job, and seen by the others as a failure shared.
    """

    def __init__(self, inner: ExampleDatabase) -> None:
        super().__init__()
        self.inner = inner
        self.muted = False

    def fetch(self, key: bytes):
        return self.inner.fetch(key)

    def save(self, key: bytes, value: bytes) -> None:
        if not self.muted:
            self.inner.save(key, value)

    def delete(self, key: bytes, value: bytes) -> None:
        self.inner.delete(key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        if not self.muted:
            self.inner.move(src, dest, value)
