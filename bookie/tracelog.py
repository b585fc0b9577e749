"""Protocol traces as NDJSON, for TLC's trace validation (tla/tracecheck.py,
tla/BookstreamTrace.tla): the one encoding of a step that the simulator
(``sim/trace.py``) and the real processes (``ClientConfig.trace_path``,
``bookstream bookie --trace FILE``) both write.

A step is ``(action, args, kw)`` with sim/spec.py's names and signatures
(``NAMES``); :func:`encode_args` turns it into the event's ``args``
(records become their header fields, bytes never reach the file).

Real processes have no shared event loop: each writes its own file, one
line per step, stamped with ``ts``, CLOCK_MONOTONIC in nanoseconds, taken
while the step's effect is in place (before the message that follows from
it leaves, after the message that caused it arrived).  On one host that
clock is the same for every process, so sorting the merged files by
``(ts, proc, seq)`` gives an order that extends causality: a send is
stamped before its receipt (tla/README.md, "Traces of the real processes").
Each line is written with one ``write`` call, unbuffered: a process killed
by SIGKILL has written every step it took.
"""
from __future__ import annotations

import json
import os
import time

from bookie import entry as E

# The names of each step's positional arguments (sim/spec.py's signatures).
NAMES = {
    "StartTakeover": ("client", "term"),
    "NoticeTakeover": ("client",),
    "Withdraw": ("client",),
    "Rejected": ("client",),
    "Finish": ("client",),
    "WriterClose": ("client", "last"),
    "WriterAdd": ("client", "entry", "value", "limit"),
    "DropAcks": ("client", "bookies", "first", "writer"),
    "EnsembleChange": ("client", "first", "ensemble", "replaced"),
    "RollFragment": ("client", "first", "ensemble"),
    "ClientSendAdd": ("client", "bookie", "entry", "record"),
    "BookieAdmit": ("bookie", "header", "accepted"),
    "ClientSendLac": ("client", "bookie", "lac", "lafr", "term"),
    "BookieWriteLac": ("bookie", "term", "exists", "accepted"),
    "BookiePrepare": ("bookie", "first", "term", "accepted"),
    "BookieStoreLac": ("bookie", "lac", "lafr"),
    "BookieStore": ("bookie", "record"),
    "ClientAddAnswer": ("client", "bookie", "entry", "counted"),
    "ClientSendRead": ("client", "bookie", "entry", "term", "fence"),
    "BookieRead": ("bookie", "term", "fence", "status", "entry"),
    "ClientFenceAnswer": ("client", "bookie", "lac", "lafr"),
    "StartReading": ("client", "start"),
    "ClientReadAnswer": ("client", "bookie", "entry", "value"),
    "RecoveryDecide": ("client", "entry", "outcome"),
    "BookieCrash": ("bookie", "durable_term", "durable_fenced"),
    "BookieRestart": ("bookie",),
}

BOOKIE_STEPS = {"BookieAdmit", "BookieStore", "BookieRead", "BookiePrepare", "BookieWriteLac",
                "BookieStoreLac", "BookieCrash", "BookieRestart"}
META_STEPS = {"StartTakeover", "Finish", "EnsembleChange", "RollFragment", "WriterClose"}


def header_fields(h) -> dict:
    return {"entry": h.entry_id, "term": h.term, "lac": h.lac, "lafr": h.lafr, "noop": h.is_noop,
            "truncate": h.is_truncate, "recovery": h.is_recovery}


def to_json(v):
    if isinstance(v, (bytes, bytearray, memoryview)):
        try:
            return header_fields(E.parse_header(bytes(v)))
        except Exception:
            return bytes(v).hex()
    if isinstance(v, E.EntryHeader):
        return header_fields(v)
    if isinstance(v, (set, frozenset)):
        return sorted(to_json(x) for x in v)
    if isinstance(v, dict):
        return {str(k): to_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [to_json(x) for x in v]
    if hasattr(v, "name") and hasattr(v, "value"):  # an enum (a Status)
        return v.name
    return v


def encode_args(action: str, args: tuple, kw: dict) -> dict:
    names = NAMES.get(action, ())
    out = {}
    for i, v in enumerate(args):
        name = names[i] if i < len(names) else f"arg{i}"
        if action == "WriterAdd" and name == "value":
            out[name] = list(v)  # ("data", payload, ...): the caller maps it to [origin term, "data"]
            continue
        if action == "ClientReadAnswer" and name == "value":
            out[name] = None if v is None else ("noop" if v[0] == "noop" else "data")
            continue
        out[name] = to_json(v)
    out.update({k: to_json(v) for k, v in kw.items()})
    return out


def record_value(rec) -> list:
    """A record's spec value from its own header: [origin term, kind]."""
    h = E.parse_header(bytes(rec))
    return [h.origin, "noop" if h.is_noop else "data"]


def shift_terms(lines: list[dict], k: int) -> list[dict]:
    """A real trace's terms as the spec's: real term t >= 1 is the spec's
    t + k (``term_offset`` in the header).  A real stream ledger is created
    at term 0 with nobody writing it, and its first writer takes it over
    (term 1) with a recovery; the spec starts with the creator writing at
    term 1.  So the header names a creator that never acts (the real term
    0 is its term, the spec's 1), and every real term moves up by k = 1.
    Term 0 (a bookie that has no state for the ledger) stays 0."""
    def t(x: int) -> int:
        return x + k if x > 0 else x

    def val(v):
        return [t(v[0]), v[1]] if isinstance(v, list) and len(v) == 2 else v

    out = []
    for e in lines:
        e = json.loads(json.dumps(e))
        a = e["args"]
        if e["action"] == "Header":
            a["term"] = t(a["term"]) if a["term"] > 0 else k
        elif e["action"] in ("StartTakeover", "BookieRead", "BookiePrepare") and isinstance(a.get("term"), int):
            a["term"] = t(a["term"])
        if isinstance(a.get("record"), dict):
            a["record"]["term"] = t(a["record"]["term"])
        if "value" in a:
            a["value"] = val(a["value"])
        for o in e.get("bk", {}).values():
            o["term"] = t(o["term"])
            o["ents"] = {n: val(v) for n, v in o.get("ents", {}).items()}
        if "meta" in e:
            e["meta"]["term"] = t(e["meta"]["term"])
        out.append(e)
    return out


STORES = ("BookieStore", "BookieStoreLac")


def stored_with(e: dict, f: dict) -> bool:
    """Whether trace event f is a store of e's bookie at e's instant.  One
    fsync applies a batch of stores, and the exporter sees the bookie after
    the whole batch: a store so followed is compared with the batch's last,
    and a read that waited for the barrier saw them all (tla/tracecheck.py,
    sim/spec_replay.py)."""
    return f["action"] in STORES and f["args"]["bookie"] == e["args"]["bookie"] and f["t"] == e["t"]


class TraceLog:
    """One process's trace file: an NDJSON line per step, written at once.

    ``proc`` names the process (a bookie id, a client's trace name); the
    lines of several processes are merged by :func:`merge`."""

    def __init__(self, path: str | os.PathLike, proc: str):
        self.path = str(path)
        self.proc = proc
        self.seq = 0
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def emit(self, action: str, args: tuple = (), kw: dict | None = None, *, actor: str | None = None,
             ts: int | None = None, **fields) -> None:
        a = encode_args(action, args, kw or {})
        self.seq += 1
        ev = {"ts": time.monotonic_ns() if ts is None else ts, "proc": self.proc, "seq": self.seq,
              "actor": actor or a.get("client") or a.get("bookie") or self.proc, "action": action, "args": a}
        ev.update(fields)
        os.write(self._fd, (json.dumps(ev, sort_keys=True) + "\n").encode())

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


NO_STATE = {"term": 0, "lac": -1, "lafr": -1, "ents": {}}  # a bookie holding nothing of the ledger


def merge(paths, header: dict, *, ledger_id: int | None = None) -> str:
    """The traces of several processes as one NDJSON trace (tla/tracecheck.py's
    input): ``header`` (the Header event's args) first, then every event of
    ``ledger_id`` (events without a ledger: all), ordered by
    ``(ts, proc, seq)``; ``i`` numbers them, ``t`` is the stamp (a batch of
    stores applied at once shares its stamp: tracecheck compares the bookie
    only after the batch's last store)."""
    evs = []
    for p in paths:
        with open(p) as f:
            for line in f:
                if not line.strip():
                    continue
                e = json.loads(line)
                if ledger_id is not None and e.get("lid", ledger_id) != ledger_id:
                    continue
                evs.append(e)
    for e in evs:
        if "bks" in e:  # a bookie's restart: its replayed state for each ledger it holds
            bks = e.pop("bks")
            b = e["args"]["bookie"]
            e["bk"] = {b: bks.get(str(ledger_id), NO_STATE) if ledger_id is not None else NO_STATE}
    evs.sort(key=lambda e: (e["ts"], e["proc"], e["seq"]))
    out = [{"i": 0, "t": 0, "actor": "world", "action": "Header", "args": header}]
    for k, e in enumerate(evs, 1):
        e = dict(e, i=k, t=e["ts"])
        out.append(e)
    return "".join(json.dumps(e, sort_keys=True) + "\n" for e in out)


class BookieTracer:
    """A real bookie's steps (``bookstream bookie --trace FILE``), written
    where bookie/storage.py applies them: stores once durable (the sim's
    ``BookieStore`` after its fsync), explicit LACs once durable, term-carrying
    reads once their barrier let them answer (the stores the barrier waited
    for come first, as tracecheck's reordering does for the simulator),
    prepares once durable or refused (bookie/server.py, rtrace9), and a
    restart once replayed (``BookieServer.start``, rtrace9).  Each event
    carries ``lid`` and the ledger's state after it (``bk``; a restart:
    ``bks``, every ledger's)."""

    def __init__(self, path: str | os.PathLike, bookie_id: str, storage):
        self.log = TraceLog(path, bookie_id)
        self.bid = bookie_id
        self.storage = storage

    def _state(self, lid: int) -> dict:
        st = self.storage.core.ledgers.get(lid)
        if st is None:
            return dict(NO_STATE)
        ents = {}
        for eid, _loc, _len in st.index.iter_all():
            status, rec = self.storage.read_record(lid, eid)
            if status.name == "OK":
                ents[str(eid)] = record_value(rec)
        return {"term": st.term, "lac": st.lac, "lafr": st.lafr, "ents": ents}

    def _bk(self, lid: int) -> dict:
        return {self.bid: self._state(lid)}

    def stores(self, body) -> None:
        """The records of one durable journal record (one batch: one stamp)."""
        ts = time.monotonic_ns()
        recs = _split(body)
        by_lid: dict[int, list] = {}
        for h, rec in recs:
            by_lid.setdefault(h.ledger_id, []).append((h, rec))
        for lid, rs in by_lid.items():
            bk = self._bk(lid)
            for h, rec in rs:
                # (bk: the state after the batch; tracecheck compares it at the batch's last store only)
                self.log.emit("BookieStore", (self.bid, rec), {"value": record_value(rec)}, ts=ts, lid=lid, bk=bk)

    def store_lac(self, lid: int, lac: int, lafr: int) -> None:
        self.log.emit("BookieStoreLac", (self.bid, lac, lafr), lid=lid, bk=self._bk(lid))

    def read(self, lid: int, term: int, fence: bool, status, entry: int | None) -> None:
        self.log.emit("BookieRead", (self.bid, term, fence, getattr(status, "name", status), entry), lid=lid,
                      bk=self._bk(lid))

    def prepare(self, lid: int, first: int, term: int, accepted: bool) -> None:
        """A Prepare answered (bookie/server.py): accepted once its term raise
        and deletion are durable, or refused (a newer term).  The trace spec
        remembers each bookie's last accepted one (BookstreamTrace's ``prep``)
        and requires it at (first, term) of the change or roll it joins."""
        self.log.emit("BookiePrepare", (self.bid, first, term, accepted), lid=lid, bk=self._bk(lid))

    def restart(self) -> None:
        """The bookie started again on its data dir (after the replay, before
        it serves): one ``BookieRestart`` event, with no ledger, carrying the
        replayed state of each ledger it holds (``bks``); :func:`merge`
        makes it the traced ledger's ``bk`` (nothing held: NO_STATE)."""
        bks = {str(lid): self._state(lid) for lid in list(self.storage.core.ledgers)}
        self.log.emit("BookieRestart", (self.bid,), bks=bks)


def _split(body) -> list:
    out = []
    buf = bytes(body)
    off = 0
    while off < len(buf):
        h = E.parse_header(buf, off)
        end = off + E.HEADER_SIZE + h.payload_len
        out.append((h, buf[off:end]))
        off = end
    return out
