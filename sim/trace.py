"""Trace export: a simulated run's protocol events as NDJSON, for TLC's
trace validation (tla/tracecheck.py, tla/BookstreamTrace.tla).

One JSON object per line, in the order the events happened (the same steps
``World.step`` records and sim/spec.py checks):

    {"i": 12, "t": 31, "actor": "b2", "action": "BookieStore",
     "args": {"bookie": "b2", "entry": 1, "value": [1, "data"], "truncate": false, ...},
     "bk": {"b2": {"term": 2, "ents": {"0": [1, "data"], "1": [1, "data"]}, "lac": 0, "lafr": -1}},
     "meta": {"state": "OPEN", "term": 2, "frags": [[0, ["b0", "b1", "b2"]]], "last": -1}}

- ``actor``: the client (c0, c1, ...) or bookie (b0, ...) whose step it is.
- ``args``: the step's arguments, JSON-encoded (records are decoded to their
  header fields and their value; see ``_value``).
- the variables the step changes, as they are after it: ``bk`` for a bookie
  step (that bookie's term, entries, LAC, LAFR), ``meta`` for a step that
  changes the ledger's metadata, ``crashed`` for a crash or a restart.

Values are the spec's: ``[t, "data"]`` for an add of the writer of term t
(payloads are unique per add, so the exporter knows each payload's term from
the WriterAdd that made it), ``[t, "noop"]`` for a no-op when its origin term
is known (the no-op a recovery of term t decided), ``[0, "noop"]`` when it is
not (a written-back no-op is the same bytes), ``[0, "none"]`` for nothing.

The header line (``"action": "Header"``) gives the scenario: bookies,
clients, creator, E/Qw/Qa, mode, the first ensemble, the writers' window.

Use: ``Tracer.attach(world)`` before running, ``tracer.dump(path)`` after;
or ``python -m sim --seed N --export-trace FILE``.
"""
from __future__ import annotations

import json
from pathlib import Path

from bookie import entry as E
from bookie.tracelog import BOOKIE_STEPS, META_STEPS, NAMES, encode_args, header_fields, to_json  # noqa: F401


class Tracer:
    """Collects the events of one World (hooked into ``World.step``)."""

    def __init__(self, world):
        self.w = world
        self.events: list[dict] = []
        self.origin: dict[bytes, int] = {}   # data payload -> the term of the writer that added it
        self.noop_origin: dict[tuple[str, int], int] = {}  # (bookie, entry) -> no-op origin, when known
        self.term: dict[str, int] = {}       # client -> its term
        creator = world.client_ids[0]
        self.term[creator] = world.meta.term
        m = world.meta
        self.events.append({
            "i": 0, "t": 0, "actor": "world", "action": "Header",
            "args": {"mode": world.sc.mode, "bookies": list(world.bookie_ids), "clients": list(world.client_ids),
                     "creator": creator, "E": m.E, "Qw": m.Qw, "Qa": m.Qa, "window": world.sc.window,
                     "seed": world.sc.seed, "frags": _frags(m.frags), "term": m.term,
                     "prepares": True, "read_answers": True},  # exported (the real processes too, since rtrace9)
        })

    @classmethod
    def attach(cls, world) -> "Tracer":
        t = cls(world)
        world.tracer = t
        return t

    # -- values ------------------------------------------------------------------------

    def _value(self, v, b: str | None = None, n: int | None = None) -> list:
        if v is None:
            return [0, "none"]
        if v[0] == "data":
            return [self.origin.get(v[1], 0), "data"]
        return [self.noop_origin.get((b, n), 0) if b is not None else 0, "noop"]

    def _bookie(self, b: str) -> dict:
        term, _fenced, ents, lac, lafr = self.w.bookie_state(b)
        return {"term": term, "lac": lac, "lafr": lafr,
                "ents": {str(n): self._value(v, b, n) for n, v in sorted(ents.items())}}

    # -- the hook ----------------------------------------------------------------------

    def record(self, action: str, args: tuple, kw: dict) -> None:
        w = self.w
        a = _args(action, args, kw)
        if action == "WriterAdd":
            self.origin[a["value"][1]] = self.term.get(a["client"], 0)
            a["value"] = [self.term.get(a["client"], 0), "data"]
        elif action == "StartTakeover":
            self.term[a["client"]] = a["term"]
        elif action == "ClientSendAdd":
            rec = args[3]
            h = E.parse_header(rec)
            v = _val(rec)
            if v[0] == "data":
                a["value"] = self._value(v)
            else:  # the client's own no-op (flagged) or a written-back one
                a["value"] = [h.term if h.is_truncate else 0, "noop"]
        elif action == "BookieStore":
            rec = args[1]
            h = E.parse_header(rec)
            if h.is_noop:
                key = (a["bookie"], h.entry_id)
                if h.is_truncate:
                    self.noop_origin[key] = h.term  # the recovery's own no-op: its term
                else:
                    self.noop_origin.pop(key, None)
                # a truncating add deletes what is above it
                if h.is_truncate:
                    for k in [k for k in self.noop_origin if k[0] == a["bookie"] and k[1] > h.entry_id]:
                        del self.noop_origin[k]
            a["value"] = self._value(_val(rec), a["bookie"], h.entry_id)
        ev = {"i": len(self.events), "t": w.now, "actor": a.get("client") or a.get("bookie") or "world",
              "action": action, "args": a}
        if action in BOOKIE_STEPS:
            ev["bk"] = {a["bookie"]: self._bookie(a["bookie"])}
            if a["bookie"] == getattr(w, "hide_term", None):
                # a store a read's barrier made durable: the bookie's term is
                # already the read's, whose step follows (-1: not compared)
                ev["bk"][a["bookie"]]["term"] = -1
        if action in META_STEPS:
            m = w.meta
            ev["meta"] = {"state": m.state, "term": m.term, "frags": _frags(m.frags), "last": m.last}
        if action in ("BookieCrash", "BookieRestart"):
            ev["crashed"] = sorted(b for b in w.bookie_ids if not w.bookies[b].up)
        self.events.append(ev)

    # -- output ------------------------------------------------------------------------

    def ndjson(self) -> str:
        return "".join(json.dumps(e, sort_keys=True) + "\n" for e in self.events)

    def dump(self, path: str | Path) -> Path:
        p = Path(path)
        p.write_text(self.ndjson())
        return p


def _val(rec: bytes) -> tuple:
    h = E.parse_header(rec)
    return ("noop",) if h.is_noop else ("data", E.payload(rec, h))


def _frags(frags) -> list:
    return [[first, list(ens)] for first, ens in frags]


# The encoding is the one the real processes write too (bookie/tracelog.py).
_header = header_fields
_json = to_json
_NAMES = NAMES
_args = encode_args
