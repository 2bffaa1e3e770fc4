"""The stored form of EventLogSaver's checkpoint and write rows, and the form it works with.

A saver works with *full* rows: a checkpoint row holds the checkpoint's every field and a
reference for each channel value; a writes row holds a task's writes.  It stores them
*compact*: short keys, the checkpoint id once, its time stamp as microseconds since 1970
(when it reads back the same), the transcript a reference points into left out when it is
the channel's own, and a checkpoint stored as what changed since its parent (``"d": 1``:
metadata, channel versions, versions seen, other fields and value references that differ,
each with the names of those that went, ``<name>x``).  The parent's id, and a write's
checkpoint id, are left out when they are the newest checkpoint of the namespace stored
before the row (LangGraph's next step, nearly always).  LangGraph moves a few versions per
step, so a checkpoint row is a few hundred bytes however many channels the graph has.

A compact row is read in the order it was stored, after its parent, and becomes the full
row again; full rows (``"kind"``) are read as they are.

References (full form -> compact form):

- a slice of a transcript, ``{"session", "start", "length", "head"}``: messages
  ``start..length`` of the chain whose message at ``length - 1`` has node ``head`` (the
  first :data:`HEAD_CHARS` hex characters of its digest) -> ``{"n", "h", "a"?, "s"?}``;
- a channel value by the serializer: ``{"type", "data"}`` -> ``{"t", "b"}``; by digest in
  the thread's blobs session: ``{"blob"}`` -> ``{"B"}``;
- messages as rows: ``{"rows"}`` -> ``{"r"}``; a dict of message lists as rows,
  ``{"rows_by_key"}`` -> ``{"rk"}``, or as transcript slices, ``{"slices_by_key"}`` -> ``{"sk"}``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = ["HEAD_CHARS", "decode_checkpoint", "decode_ref", "decode_writes", "encode_checkpoint", "encode_writes"]

HEAD_CHARS = 32
"""Hex characters of a node digest a transcript reference keeps (128 bits)."""

Sessions = Callable[[str], str]
"""The transcript session of a channel (or a key of a dict of message lists) in a namespace."""


def encode_ref(ref: dict[str, Any], own: str) -> dict[str, Any]:
    """The compact form of ``ref``; ``own`` is the transcript its channel or key would use."""
    if "session" in ref:
        out: dict[str, Any] = {"n": ref["length"], "h": ref["head"] or ""}
        if ref.get("start"):
            out["a"] = ref["start"]
        if ref["session"] != own:
            out["s"] = ref["session"]
        return out
    if "type" in ref:
        return {"t": ref["type"], "b": ref["data"]} if ref["data"] else {"t": ref["type"]}
    if "blob" in ref:
        return {"B": ref["blob"]}
    if "rows" in ref:
        return {"r": ref["rows"]}
    if "rows_by_key" in ref:
        return {"rk": ref["rows_by_key"]}
    if "slices_by_key" in ref:
        return {"sk": {key: encode_ref(item, own) for key, item in ref["slices_by_key"].items()}}
    raise ValueError(f"not a channel value reference: {sorted(ref)}")


def decode_ref(stored: dict[str, Any], own: str) -> dict[str, Any]:
    """The full form of a compact reference (a full one is returned as it is)."""
    if "n" in stored:
        return {
            "session": stored.get("s", own),
            "start": stored.get("a", 0),
            "length": stored["n"],
            "head": stored["h"] or None,
        }
    if "t" in stored:
        return {"type": stored["t"], "data": stored.get("b", "")}
    if "B" in stored:
        return {"blob": stored["B"]}
    if "r" in stored:
        return {"rows": stored["r"]}
    if "rk" in stored:
        return {"rows_by_key": stored["rk"]}
    if "sk" in stored:
        return {"slices_by_key": {key: decode_ref(item, own) for key, item in stored["sk"].items()}}
    return stored


def _delta(new: dict[str, Any], old: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    changed = {key: value for key, value in new.items() if key not in old or old[key] != value}
    return changed, [key for key in old if key not in new]


def _undelta(old: dict[str, Any], changed: dict[str, Any], gone: list[str]) -> dict[str, Any]:
    out = {key: value for key, value in old.items() if key not in gone}
    out.update(changed)
    return out


_FIELDS = ("id", "ts", "channel_versions", "versions_seen")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _split(rest: Any) -> dict[str, Any] | None:
    """The checkpoint's fields when they can be stored field by field (else None: stored whole)."""
    if type(rest) is not dict or not all(key in rest for key in _FIELDS):
        return None
    if type(rest["channel_versions"]) is not dict or type(rest["versions_seen"]) is not dict:
        return None
    if not all(type(seen) is dict for seen in rest["versions_seen"].values()):
        return None
    return rest


def _time(ts: Any) -> Any:
    """LangGraph's time stamp (UTC, ISO 8601, microseconds) as microseconds since 1970, when it reads back so."""
    if type(ts) is not str or not ts.endswith("+00:00"):
        return ts
    try:
        found = datetime.fromisoformat(ts)
    except ValueError:
        return ts
    micros = (found - _EPOCH) // timedelta(microseconds=1)
    return micros if _stamp(micros) == ts else ts


def _stamp(ts: Any) -> Any:
    return (_EPOCH + timedelta(microseconds=ts)).isoformat() if type(ts) is int else ts


def _delta_into(out: dict[str, Any], name: str, new: Any, old: Any) -> None:
    """``out[name]``: what changed in dict ``new`` since dict ``old`` (``out[name + "x"]``: keys gone)."""
    if type(new) is dict and type(old) is dict:
        out[name], gone = _delta(new, old)
        if gone:
            out[name + "x"] = gone
    else:
        out[name + "="] = new


def _undelta_from(stored: dict[str, Any], name: str, old: Any) -> Any:
    if name + "=" in stored:
        return stored[name + "="]
    return _undelta(old, stored.get(name, {}), stored.get(name + "x", []))


def encode_checkpoint(
    row: dict[str, Any], parent: dict[str, Any] | None, latest: str | None, sessions: Sessions
) -> dict[str, Any]:
    """The compact form of full checkpoint ``row``, as what changed since ``parent`` when given.

    ``latest`` is the id of the newest checkpoint of the row's namespace stored before it:
    the parent is left out when it is that one (LangGraph's next step, nearly always).
    """
    ns = row["ns"]
    out: dict[str, Any] = {"k": "c", "id": row["id"]}
    if ns:
        out["ns"] = ns
    if row["parent"] and not (parent is not None and row["parent"] == latest):
        out["p"] = row["parent"]
    rest = _split(row["checkpoint"])
    base = _split(parent["checkpoint"]) if parent is not None else None
    if rest is None or rest["id"] != row["id"]:
        out["x"] = row["checkpoint"]
        base = None
    else:
        out["ts"] = _time(rest["ts"])
    refs = {channel: encode_ref(ref, sessions(channel)) for channel, ref in row["values"].items()}
    if rest is not None and base is not None and parent is not None:
        out["d"] = 1
        _delta_into(out, "m", row["metadata"], parent["metadata"])
        _delta_into(out, "cv", rest["channel_versions"], base["channel_versions"])
        _delta_into(out, "vs", rest["versions_seen"], base["versions_seen"])
        _delta_into(out, "o", _others(rest), _others(base))
        old = {channel: encode_ref(ref, sessions(channel)) for channel, ref in parent["values"].items()}
        _delta_into(out, "v", refs, old)
    else:
        out["m"] = row["metadata"]
        if rest is not None and "x" not in out:
            out["cv"] = rest["channel_versions"]
            out["vs"] = rest["versions_seen"]
            out["o"] = _others(rest)
        out["v"] = refs
    return out


def _others(rest: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in rest.items() if key not in _FIELDS}


def decode_checkpoint(
    stored: dict[str, Any],
    parent_of: Callable[[str, str], dict[str, Any] | None],
    latest: Callable[[str], str | None],
    sessions: Callable[[str], Sessions],
) -> dict[str, Any]:
    """The full checkpoint row of a compact one; ``parent_of(ns, id)`` finds a full row read before,
    ``latest(ns)`` the id of the newest one."""
    ns = stored.get("ns", "")
    own = sessions(ns)
    delta = bool(stored.get("d"))
    parent_id = stored.get("p") or (latest(ns) if delta else None)
    row: dict[str, Any] = {"kind": "checkpoint", "ns": ns, "id": stored["id"], "parent": parent_id}
    if delta:
        parent = parent_of(ns, parent_id) if parent_id else None
        base = _split(parent["checkpoint"]) if parent is not None else None
        if parent is None or base is None:
            raise ValueError(f"checkpoint {stored['id']!r} is stored as changes to {parent_id!r}, which was not read")
        row["metadata"] = _undelta_from(stored, "m", parent["metadata"])
        versions = _undelta_from(stored, "cv", base["channel_versions"])
        seen = _undelta_from(stored, "vs", base["versions_seen"])
        others = _undelta_from(stored, "o", _others(base))
        old = {channel: encode_ref(ref, own(channel)) for channel, ref in parent["values"].items()}
        refs = _undelta_from(stored, "v", old)
        values = {
            channel: parent["values"][channel]
            if channel in old and old[channel] is ref
            else decode_ref(ref, own(channel))
            for channel, ref in refs.items()
        }
    else:
        row["metadata"] = stored["m"]
        versions, seen, others = stored.get("cv", {}), stored.get("vs", {}), stored.get("o", {})
        values = {channel: decode_ref(ref, own(channel)) for channel, ref in stored["v"].items()}
    if "x" in stored:
        row["checkpoint"] = stored["x"]
    else:
        row["checkpoint"] = {
            "id": stored["id"],
            "ts": _stamp(stored["ts"]),
            "channel_versions": versions,
            "versions_seen": seen,
            **others,
        }
    row["values"] = values
    return row


def encode_writes(row: dict[str, Any], latest: str | None, sessions: Sessions) -> dict[str, Any]:
    """The compact form of full writes ``row``; the checkpoint is left out when it is ``latest``."""
    out: dict[str, Any] = {
        "k": "w",
        "t": row["task"],
        "w": [[index, channel, encode_ref(ref, sessions(channel))] for index, channel, ref in row["writes"]],
    }
    if row["checkpoint"] != latest:
        out["c"] = row["checkpoint"]
    if row["ns"]:
        out["ns"] = row["ns"]
    if row["path"]:
        out["p"] = row["path"]
    return out


def decode_writes(
    stored: dict[str, Any], latest: Callable[[str], str | None], sessions: Callable[[str], Sessions]
) -> dict[str, Any]:
    """The full writes row of a compact one."""
    ns = stored.get("ns", "")
    own = sessions(ns)
    return {
        "kind": "writes",
        "ns": ns,
        "checkpoint": stored["c"] if "c" in stored else latest(ns),
        "task": stored["t"],
        "path": stored.get("p", ""),
        "writes": [[index, channel, decode_ref(ref, own(channel))] for index, channel, ref in stored["w"]],
    }
