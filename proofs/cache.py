"""The proof cache: a verdict is reused only for the formula it was found for.

A rerun of ``kvarena verify`` or ``kvarena prove`` then proves only the
obligations whose formula changed.  Each verdict is keyed by a SHA-256 of:

- ``FORMAT``, the z3 version (``z3.get_full_version()``);
- the budget: the obligation's ``timeout_s`` with ``UNITS_PER_S``,
  ``WALL_GUARD`` and the tautology check's seconds (``core.key_text``);
- the procedure: the source of ``proofs/core.py``, which states how each
  query is checked (its tactics, its hint order, the lemmas it adds);
- the obligation's name, expected result and tautology rule;
- the SMT-LIB text, as z3 prints it (``to_smt2``), of every query the
  obligation sends the solver: each case's proof query with its lemmas
  (and with its hints), each vacuity query, each tautology goal
  (``core.query_texts``).

So a changed formula, a planted spec bug included, never meets an old
entry: its text, and so its key, differ.  Only passing verdicts are
stored.  An entry is trusted only if it parses, its format, key and
obligation are this one's, its digest matches its content and its verdict
passes under the obligation's rules as they are now; any other entry is
ignored with a warning, proved afresh and overwritten.

Where: ``.kvarena-cache/proofs/`` under the working directory by default
(``KVARENA_PROOF_CACHE`` names another folder; git ignores this one), or
a Redis server (``redis://host:port/n``, keys ``kvarena:proof:KEY``) that
a CI fleet shares, the one its fuzz workers use.
"""

import hashlib
import json
import os
from pathlib import Path

FORMAT = "kvarena-proof-cache/1"
DEFAULT_DIR = ".kvarena-cache/proofs"
ENV = "KVARENA_PROOF_CACHE"
REDIS_PREFIX = "kvarena:proof:"
# what a verdict is: the fields a cached row keeps (times and the rest are the run's own)
VERDICT = (
    "result",
    "counterexample",
    "reason",
    "vacuity",
    "tautology",
    "tautological_conjuncts",
    "cases",
    "witnesses",
    "units",
    "limit_units",
    "time_s",
)


def default_location():
    """The cache a command uses when none is named: ``$KVARENA_PROOF_CACHE`` or ``.kvarena-cache/proofs``."""
    return os.environ.get(ENV) or DEFAULT_DIR


def digest(*parts):
    """SHA-256 (hex) of ``parts``, each text, length-prefixed so no two lists hash alike."""
    h = hashlib.sha256()
    for p in parts:
        b = str(p).encode()
        h.update(len(b).to_bytes(8, "big"))
        h.update(b)
    return h.hexdigest()


class FolderStore:
    """One JSON file per key, written whole (a temporary file, then renamed)."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self.where = str(self.folder)

    def _path(self, key):
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key):
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def put(self, key, data):
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)


class RedisStore:
    """Keys ``kvarena:proof:KEY`` on a Redis server."""

    def __init__(self, url):
        import redis

        self.client = redis.Redis.from_url(url)
        self.where = url

    def get(self, key):
        return self.client.get(REDIS_PREFIX + key)

    def put(self, key, data):
        self.client.set(REDIS_PREFIX + key, data)


def open_store(location):
    """The store at ``location``: a ``redis://`` URL or a folder."""
    if str(location).startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(str(location))
    return FolderStore(location)


def check_location(location):
    """``None`` when the cache at ``location`` can be used, else why not (for the command to print)."""
    try:
        store = open_store(location)
        if isinstance(store, RedisStore):
            store.client.ping()
        else:
            store.folder.mkdir(parents=True, exist_ok=True)
    except ImportError:
        return f"--cache {location}: needs the redis package (pip install redis)"
    except Exception as e:  # an unreachable server, an unwritable folder
        return f"--cache {location}: {type(e).__name__}: {e}"
    return None


def in_child(fn, *args):
    """``fn(*args)`` (a JSON-able result) in a forked child process, so
    that nothing it builds stays in this one; ``None`` where the platform
    cannot fork or the child fails.  The child is a copy of a process that
    has built nothing yet (a solver process), so what it prints is the same
    every run."""
    if not hasattr(os, "fork"):
        return None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: compute, send, leave without running any exit handler
        code = 1
        try:
            os.close(read)
            with os.fdopen(write, "wb") as out:
                out.write(json.dumps(fn(*args), default=str).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as got:
        data = got.read()
    _, status = os.waitpid(pid, 0)
    return json.loads(data) if status == 0 and data else None


def _entry(key, name, z3_version, row):
    body = {"format": FORMAT, "key": key, "obligation": name, "z3": z3_version, "row": row}
    return {**body, "digest": digest(json.dumps(body, sort_keys=True, default=str))}


def save(store, key, name, z3_version, res):
    """Store the verdict of ``res`` (a passing result row) under ``key``."""
    row = {k: res[k] for k in VERDICT if k in res}
    store.put(key, json.dumps(_entry(key, name, z3_version, row), sort_keys=True, default=str).encode())


def load(store, key, name, passes):
    """``(row, warning)``: the cached verdict for ``key`` if it can be
    trusted, else ``None``; ``warning`` says why an entry found was not.
    ``passes(row)`` is the obligation's current rule for a passing verdict."""
    data = store.get(key)
    if data is None:
        return None, None
    where = f"proof cache entry {key[:12]} ({name}) in {store.where}"
    try:
        entry = json.loads(data)
        body = {k: entry[k] for k in ("format", "key", "obligation", "z3", "row")}
        sealed = entry["digest"]
        row = body["row"]
        if not isinstance(row, dict):
            raise TypeError("its row is not an object")
    except (ValueError, KeyError, TypeError) as e:
        return None, f"{where}: corrupt ({type(e).__name__}: {e}); ignored, proving afresh"
    if sealed != digest(json.dumps(body, sort_keys=True, default=str)):
        return None, f"{where}: corrupt (its digest does not match its content); ignored, proving afresh"
    if (body["format"], body["key"], body["obligation"]) != (FORMAT, key, name):
        return None, (
            f"{where}: foreign (format {body['format']!r}, key {str(body['key'])[:12]}, obligation "
            f"{body['obligation']!r}); ignored, proving afresh"
        )
    if not passes(row):
        return None, f"{where}: foreign (its verdict {row.get('result')!r} does not pass); ignored, proving afresh"
    return row, None
