"""What crosses between the judge and a candidate's process, and the judge's limits on it.

Values cross as tagged JSON of plain data (None, bool, int, float, str, bytes, complex, list,
tuple, set, frozenset, dict); anything else stays in the candidate's process and crosses as an
opaque reference, a :class:`Proxy` here, whose calls, attributes and iteration run over there
while its equality, hash and identity are the judge's (the candidate's side of the codec is in
:mod:`harness.sandbox.forkserver`).

The judge runs outside every sandbox limit, so what a candidate sends it is bounded *before* it
is decoded (:func:`check_reply_size`: bytes, values, tagged objects of one reply), over one
loaded program (:data:`MAX_SESSION_BYTES`, :data:`MAX_SESSION_OPS`), and while decoding
(:data:`MAX_DEPTH`; :data:`MAX_HASH_CLASHES` distinct values with equal hashes, which would make
a set or dict of them cost the judge O(n^2)). Past a limit the call raises
:class:`ReplyTooLargeError`. A module the candidate imported is bound, for the tests, to the
judge's own copy only if importing it has no side effects (:func:`judge_module`).
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

# A reply of MAX_REPLY_CONTAINERS nested lists costs the judge about 60 MB while it is decoded
# (benchmarks/code_grading.py --attacks measures it); the largest HumanEval/MBPP/LeetCode
# reference return values are far below every limit.
MAX_REPLY_BYTES = 8 << 20
MAX_REPLY_VALUES = 1_000_000
MAX_REPLY_CONTAINERS = 100_000
# Over one program graded for one problem (every call, attribute, iteration step of every test,
# across reloads after a failed call): replies in all, and operations. A remote iterator
# yielding 8 MiB strings would otherwise grow the judge by gigabytes within a problem's time.
MAX_SESSION_BYTES = 64 << 20
MAX_SESSION_OPS = 1_000_000
# Tagged objects in all replies of one program: decoding them is what costs the judge CPU
# (about 3.5 us each: a reply of MAX_REPLY_CONTAINERS takes 0.35 s).
MAX_SESSION_CONTAINERS = 500_000
# Distinct hashable values whose hash equals another's, counted over one loaded program's
# containers of 64 or more elements: a set, dict or `in` test over n such values costs the judge
# O(n^2) with the GIL held (ints k * (2**61 - 1) all hash to 0).
MAX_HASH_CLASHES = 1000
MAX_DEPTH = 200


@dataclass
class Spent:
    """What one program has sent the judge, against the limits above that hold for a whole
    program (every process of it loaded for one problem)."""

    bytes: int = 0
    containers: int = 0
    ops: int = 0
    clashes: int = 0


class Channel(Protocol):
    """What a :class:`Proxy` needs of its session: one request, one decoded reply; and what
    the program has spent, which the decoder counts too."""

    spent: Spent
    dead: str | None

    def op(self, payload: dict[str, Any]) -> dict[str, Any]: ...

    def call(self, ref: Proxy, args: tuple, kwargs: dict[str, Any]) -> Any: ...


class RemoteError(Exception):
    """The candidate raised (the message is its exception), or returned something invalid."""


class RemoteTimeoutError(RemoteError):
    """The candidate ran past its time; its process tree was killed."""


class RemoteDiedError(RemoteError):
    """The candidate's process (or the whole sandbox) is gone."""


class ServerFailureError(RemoteDiedError):
    """The fork server itself stopped answering properly, or its sandbox is no longer clean;
    it has been replaced."""


class ReplyTooLargeError(RemoteError):
    """The candidate's reply is over the judge's limits; nothing of it was decoded."""


def check_reply_size(body: bytes) -> None:
    """Refuse a reply over the limits before decoding it. Every JSON value but the first
    follows a ``[``, ``,`` or ``:``, and every tagged object is a ``{``: counting those bytes
    bounds what ``json.loads`` would build (strings containing them only make it stricter)."""
    if len(body) > MAX_REPLY_BYTES:
        raise ReplyTooLargeError(f"reply of {len(body)} bytes (limit {MAX_REPLY_BYTES})")
    containers = body.count(b"{")
    if containers > MAX_REPLY_CONTAINERS:
        raise ReplyTooLargeError(f"reply with {containers} objects "
                                 f"(limit {MAX_REPLY_CONTAINERS})")
    values = body.count(b",") + body.count(b"[") + body.count(b":")
    if values > MAX_REPLY_VALUES:
        raise ReplyTooLargeError(f"reply with {values} values (limit {MAX_REPLY_VALUES})")


# Standard-library modules without side effects on import, which a test may use through the
# candidate's `import` (the tests run with the candidate's names).
JUDGE_MODULES = frozenset({
    "array", "bisect", "cmath", "collections", "copy", "datetime", "decimal", "fractions",
    "functools", "hashlib", "heapq", "itertools", "json", "math", "numbers", "operator",
    "random", "re", "statistics", "string", "sys", "typing",
})


def judge_module(name: str) -> Any:
    """The judge's own module ``name``: one it already imported, or one of
    :data:`JUDGE_MODULES`; None otherwise (importing ``this`` prints, ``antigravity`` opens a
    browser, ``msvcrt`` fails)."""
    module = sys.modules.get(name)
    if module is None and name in JUDGE_MODULES:
        with contextlib.suppress(Exception):
            module = importlib.import_module(name)
    return module if name in sys.stdlib_module_names else None


def copy_back(original: Any, new: Any) -> None:
    """Mirror the candidate's in-place change of a list/dict/set argument onto the judge's."""
    with contextlib.suppress(TypeError, ValueError):
        if type(original) is list and type(new) is list:
            original[:] = new
        elif type(original) in (dict, set) and type(new) is type(original):
            original.clear()
            original.update(new)


class Proxy:
    """An opaque candidate object. Calls, attribute access and iteration run in the candidate's
    process; equality and hashing are the judge's (identity), never the candidate's; the truth
    value comes back as a plain bool."""

    __slots__ = ("_id", "_kind", "_session", "_type")

    def __init__(self, session: Channel, ref_id: int, kind: str, type_name: str) -> None:
        object.__setattr__(self, "_session", session)
        object.__setattr__(self, "_id", ref_id)
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_type", type_name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._session.call(self, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return decode(self._session.op({"op": "getattr", "ref": self._id, "name": name})["value"],
                      self._session)

    def __setattr__(self, name: str, value: Any) -> None:
        self._session.op({"op": "setattr", "ref": self._id, "name": name,
                          "value": encode(value)})

    def __iter__(self) -> Iterator[Any]:
        it = decode(self._session.op({"op": "iter", "ref": self._id})["value"], self._session)
        if not isinstance(it, Proxy):
            raise RemoteError("iterator is not an object")
        while True:
            msg = self._session.op({"op": "next", "ref": it._id})
            if msg.get("stop") is True:
                return
            yield decode(msg.get("value"), self._session)

    def __len__(self) -> int:
        try:
            n = decode(self._session.op({"op": "len", "ref": self._id})["value"],
                       self._session)
        except (RemoteDiedError, RemoteTimeoutError, ReplyTooLargeError):
            raise
        except RemoteError as exc:
            # the candidate's own len() raised (a generator has none): a TypeError, so that
            # list(), sorted(), tuple() fall back to iterating, as on a local object
            raise TypeError(str(exc)) from None
        if type(n) is not int or n < 0 or n > MAX_REPLY_VALUES:
            # a huge len() makes tuple()/list() preallocate in the judge before iterating
            raise RemoteError(f"len() of a candidate object is not an int in [0, "
                              f"{MAX_REPLY_VALUES}]")
        return n

    def __getitem__(self, key: Any) -> Any:
        msg = self._session.op({"op": "getitem", "ref": self._id, "key": encode(key)})
        return decode(msg["value"], self._session)

    def __bool__(self) -> bool:
        # Evaluated by the candidate, but it returns only a bool: no more power than returning
        # True/False itself (re.Match results, custom truthy objects in MBPP tests).
        value = self._session.op({"op": "bool", "ref": self._id})["value"]
        if type(value) is not bool:
            raise RemoteError("bool() of a candidate object is not a bool")
        return value

    def __repr__(self) -> str:
        return f"<candidate {self._kind} {self._type!s:.40}>"


_PLAIN = (type(None), bool, int, float, str)
_CONTAINERS = {list: "list", tuple: "tuple", set: "set", frozenset: "frozenset"}


def encode(x: Any, depth: int = 0) -> Any:
    """Judge value -> tagged JSON for the candidate (plain data and this session's proxies)."""
    if depth > MAX_DEPTH:
        raise ValueError("argument nested too deeply")
    if type(x) in _PLAIN:
        return x
    if isinstance(x, Proxy):
        return {"t": "ref", "id": x._id}
    name = getattr(x, "__name__", None)
    if isinstance(name, str) and getattr(builtins, name, None) is x:
        return {"t": "builtin", "v": name}  # int, str, len, ... (MBPP passes types)
    if isinstance(x, (bytes, bytearray)):
        return {"t": "bytes", "v": bytes(x).hex()}
    if isinstance(x, complex):
        return {"t": "complex", "v": [x.real, x.imag]}
    if isinstance(x, dict):
        return {"t": "dict", "v": [[encode(k, depth + 1), encode(v, depth + 1)]
                                   for k, v in x.items()]}
    for cls, tag in _CONTAINERS.items():
        if isinstance(x, cls):
            return {"t": tag, "v": [encode(e, depth + 1) for e in x]}
    if isinstance(x, (int, float, str)):
        return type(x).__mro__[-2](x)  # subclasses (IntEnum, ...) cross as their base value
    raise TypeError(f"cannot pass a {type(x).__name__} to a sandboxed candidate")


def decode(x: Any, session: Channel, depth: int = 0) -> Any:
    """Tagged JSON from the candidate -> judge values built only from builtin types."""
    if depth > MAX_DEPTH:
        raise RemoteError("value nested too deeply")
    if type(x) in _PLAIN:
        return x
    if type(x) is not dict or type(x.get("t")) is not str:
        raise RemoteError("malformed value from candidate")
    t, v = x["t"], x.get("v")
    try:
        if t == "ref":
            return Proxy(session, int(x["id"]), str(x.get("kind", "object"))[:20],
                         str(x.get("type", "?"))[:60])
        if t == "bytes":
            return bytes.fromhex(v)
        if t == "complex":
            return complex(float(v[0]), float(v[1]))
        if t == "dict":
            pairs = [(decode(k, session, depth + 1), decode(val, session, depth + 1))
                     for k, val in v]
            _count_clashes([k for k, _ in pairs], session)
            return dict(pairs)
        items = [decode(e, session, depth + 1) for e in v]
        _count_clashes(items, session)
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[t](items)
    except RemoteError:
        raise
    except Exception as exc:
        raise RemoteError(f"malformed value from candidate ({type(exc).__name__})") from None


def _count_clashes(items: list[Any], session: Channel) -> None:
    """Count values in ``items`` whose hash equals an earlier, different value's; refuse the
    reply past :data:`MAX_HASH_CLASHES` for the session. O(n): only the first value per hash is
    kept, and the hashes themselves are distinct ints (their own hashes do not clash)."""
    if len(items) < 64:
        return
    first: dict[int, Any] = {}
    for item in items:
        try:
            h = hash(item)
        except TypeError:  # lists, dicts, sets: not a key of anything the judge builds
            continue
        seen = first.setdefault(h, item)
        if seen is not item and seen != item:
            session.spent.clashes += 1
    if session.spent.clashes > MAX_HASH_CLASHES:
        session.dead = "too_large"
        raise ReplyTooLargeError(f"{session.spent.clashes} values with colliding hashes "
                                 f"(limit {MAX_HASH_CLASHES})")


