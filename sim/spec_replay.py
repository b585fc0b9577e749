"""An NDJSON trace (sim/trace.py, bookie/tracelog.py) replayed through
sim/spec.py's ``Model``: the transcription's verdict on a trace, beside
TLC's (tla/tracecheck.py), so that the two checkers can be compared on the
same input (issue 14 item 5; tla/differential.py perturbs traces and asks
both).

The trace keeps less than the simulator hands the model, and the replay
fills it in from the model itself, never from the implementation:

- a record is rebuilt from its header fields; a data payload is empty (the
  spec's values are ``Data(t)``: every add of a term is the same value);
- a value's origin term 0 means "not known" (a written-back no-op): a
  send takes the client's own value, a store the value last sent to that
  bookie for that entry;
- a recovery read's answer (``ClientReadAnswer`` says only its kind) is
  the value the model's bookie held when it answered (its ``BookieRead``);
- the real processes' traces (bookie/tracelog.py) have their terms shifted
  as TLC's are, the header's window as each add's limit, and a writer's
  proposal (``DropAcks``, which they do not export) taken at its change,
  a killed bookie's durable term the one its restart replayed, and a range
  read (one ``BookieRead``, of its first entry) answering each id above its
  first with what the bookie held when it read.

After each event the model's bookie (``bk``), metadata (``meta``) and
crashed set (``crashed``) are compared with what the event reports, as the
simulator compares them with the real state (a value with origin 0 matches
any origin of its kind; a term of -1 is not compared).  What the simulator
also compares and the trace does not carry (the clients' own state) is not
checked here.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from bookie import entry as E
from bookie.tracelog import STORES, shift_terms, stored_with
from sim.metadata import LedgerMeta
from sim.spec import Model, SpecViolation, is_noop, origin_of

LID = 1


@dataclass
class ReplayVerdict:
    accepted: bool
    events: int                  # events after the header
    rejected_at: int | None      # the event's index ("i" order, 1 = the first after the header)
    action: str | None
    reason: str | None

    def describe(self) -> str:
        if self.accepted:
            return f"accepted: {self.events} events"
        return f"REJECTED at event {self.rejected_at} of {self.events} ({self.action}): {self.reason}"


def _events(trace) -> list[dict]:
    if isinstance(trace, str):
        return [json.loads(x) for x in trace.splitlines() if x.strip()]
    return list(trace)


def _frags(fs) -> tuple:
    return tuple((int(first), tuple(ens)) for first, ens in fs)


class Replay:
    def __init__(self, header: dict, *, real: bool = False):
        h = header
        self.unbounded = h["mode"] == "unbounded"
        self.window = h["window"]   # (real clients do not export each add's limit: the header's)
        meta = LedgerMeta(state="OPEN", term=h["term"], frags=_frags(h["frags"]), E=h["E"], Qw=h["Qw"], Qa=h["Qa"])
        self.model = Model(bookies=h["bookies"], E=h["E"], Qw=h["Qw"], Qa=h["Qa"], unbounded=self.unbounded,
                           meta=meta, clients=h["clients"], creator=h["creator"])
        self.sent: dict[tuple[str, int], int] = {}     # (bookie, entry) -> origin of the no-op last sent there
        # a real bookie's range read is one BookieRead of its first entry: (bookie, term) ->
        # [(first entry, what the bookie held then)], whose ids above the first it answered too
        self.real = real   # the real processes' trace (merged: each event names its process)
        self.ranges: dict[tuple[str, int], list] = {}

    # -- trace fields -> the model's arguments --------------------------------------------

    def _record(self, r: dict, origin: int) -> bytes:
        flags = (E.FLAG_NOOP if r["noop"] else 0) | (E.FLAG_TRUNCATE if r["truncate"] else 0)
        return E.encode(LID, r["entry"], b"", lac=r["lac"], lafr=r["lafr"], term=r["term"], data_flags=flags,
                        req_flags=E.REQ_RECOVERY if r["recovery"] else 0, origin=min(origin, r["term"]))

    def _send_origin(self, a: dict) -> int:
        o = a["value"][0]
        if o == 0 and a["record"]["noop"]:  # a written-back no-op: the client's own
            v = self.model.cl[a["client"]].val.get(a["record"]["entry"])
            o = origin_of(v) if v is not None and is_noop(v) else 0
        return o

    def _store_origin(self, a: dict) -> int:
        o = a["value"][0]
        if o == 0 and a["record"]["noop"]:
            o = self.sent.get((a["bookie"], a["record"]["entry"]), 0)
        return o

    # -- one event ------------------------------------------------------------------------

    def step(self, e: dict, *, compare: bool = True) -> None:
        m, act, a = self.model, e["action"], e["args"]
        if act == "WriterAdd":
            m.WriterAdd(a["client"], a["entry"], ("data", b"", a["value"][0]), a.get("limit", self.window))
        elif act == "ClientSendAdd":
            o = self._send_origin(a)
            if a["record"]["noop"]:
                self.sent[(a["bookie"], a["record"]["entry"])] = o
            m.ClientSendAdd(a["client"], a["bookie"], a["entry"], self._record(a["record"], o),
                            **({"resend": True} if a.get("resend") else {}))
        elif act == "BookieAdmit":
            hd = E.parse_header(self._record(a["header"], a["header"]["term"]))
            m.BookieAdmit(a["bookie"], hd, a["accepted"])
        elif act == "BookieStore":
            m.BookieStore(a["bookie"], self._record(a["record"], self._store_origin(a)))
        elif act == "BookieRead":
            b, n = a["bookie"], a["entry"]
            m.BookieRead(b, a["term"], a["fence"], a["status"], n)
            if a["status"] in ("OK", "NO_SUCH_ENTRY"):  # its answer, from the model's bookie
                k = m.bk[b]
                ans = (k.lac, k.lafr) if n is None else (k.ents.get(n) if a["status"] == "OK" else None)
                m.answered(b, n, a["term"], ans)
                if n is not None and self.real:
                    self.ranges.setdefault((b, a["term"]), []).append((n, dict(k.ents)))
        elif act == "ClientReadAnswer":
            key = (a["bookie"], a["entry"])
            term = m.cl[a["client"]].term
            if self.real and key not in m.answers:  # an id a range read answered after its first
                first, held = next(((f, x) for f, x in reversed(self.ranges.get((a["bookie"], term), []))
                                    if f <= a["entry"]), (None, {}))
                if first is not None:
                    m.answered(a["bookie"], a["entry"], term, held.get(a["entry"]))
            v = m.answers[key][-1][1] if key in m.answers else None  # the bookie's last answer for it
            kind = None if v is None else ("noop" if is_noop(v) else "data")
            if kind != a["value"]:
                raise SpecViolation(act, f"{a['bookie']} answered {kind} for {a['entry']} at its read, the client "
                                         f"took {a['value']}")
            m.ClientReadAnswer(a["client"], a["bookie"], a["entry"], v)
        elif act in ("DropAcks",):
            m.DropAcks(a["client"], set(a["bookies"]), a["first"], a["writer"])
        elif act == "EnsembleChange":
            w = m.cl[a["client"]]
            if w.phase == "open" and w.proposed is None:  # a real writer exports no proposal: taken here
                m.DropAcks(a["client"], set(a["replaced"]), a["first"], True)
            m.EnsembleChange(a["client"], a["first"], tuple(a["ensemble"]), dict(a["replaced"]))
        elif act == "RollFragment":
            m.RollFragment(a["client"], a["first"], tuple(a["ensemble"]))
        elif act == "ClientSendRead":
            m.ClientSendRead(a["client"], a["bookie"], a["entry"], a["term"], a["fence"])
        else:  # the rest take the trace's arguments as they are
            getattr(m, act)(**_kwargs(act, a))
        if compare:
            self.compare(e)

    # -- the state the event reports ------------------------------------------------------

    def compare(self, e: dict) -> None:
        m = self.model
        for b, o in e.get("bk", {}).items():
            k = m.bk[b]
            if o["term"] >= 0 and o["term"] != k.term:
                raise SpecViolation("state", f"bookie {b}: term {k.term} in the spec, {o['term']} in the trace")
            if (o["lac"], o["lafr"]) != (k.lac, k.lafr):
                raise SpecViolation("state", f"bookie {b}: LAC/LAFR {k.lac}/{k.lafr} in the spec, "
                                             f"{o['lac']}/{o['lafr']} in the trace")
            got = {int(n): v for n, v in o["ents"].items()}
            if set(got) != set(k.ents) or any(not _match(k.ents[n], got[n]) for n in got):
                raise SpecViolation("state", f"bookie {b}: entries {_show(k.ents)} in the spec, {got} in the trace")
        if "meta" in e:
            mm, o = m.meta, e["meta"]
            if (mm.state, mm.term, mm.frags) != (o["state"], o["term"], _frags(o["frags"])) or \
                    (o["state"] == "CLOSED" and mm.last != o["last"]):
                raise SpecViolation("state", f"metadata {mm} in the spec, {o} in the trace")
        if "crashed" in e and set(e["crashed"]) != m.crashed:
            raise SpecViolation("state", f"crashed {sorted(m.crashed)} in the spec, {e['crashed']} in the trace")


_ARGS = {  # the model's keyword names for the trace's argument names (bookie/tracelog.py NAMES)
    "StartTakeover": {"client": "c", "term": "t"},
    "NoticeTakeover": {"client": "c"}, "Withdraw": {"client": "c"}, "Rejected": {"client": "c"},
    "Finish": {"client": "c"}, "WriterClose": {"client": "c", "last": "last"},
    "ClientSendLac": {"client": "c", "bookie": "b", "lac": "lac", "lafr": "lafr", "term": "term"},
    "BookieWriteLac": {"bookie": "b", "term": "term", "exists": "exists", "accepted": "accepted"},
    "BookiePrepare": {"bookie": "b", "first": "first", "term": "term", "accepted": "accepted"},
    "BookieStoreLac": {"bookie": "b", "lac": "lac", "lafr": "lafr"},
    "ClientAddAnswer": {"client": "c", "bookie": "b", "entry": "n", "counted": "counted"},
    "ClientFenceAnswer": {"client": "c", "bookie": "b", "lac": "lac", "lafr": "lafr"},
    "StartReading": {"client": "c", "start": "start"},
    "RecoveryDecide": {"client": "c", "entry": "n", "outcome": "outcome"},
    "BookieCrash": {"bookie": "b", "durable_term": "durable_term", "durable_fenced": "durable_fenced"},
    "BookieRestart": {"bookie": "b"},
}


def _kwargs(act: str, a: dict) -> dict:
    names = _ARGS.get(act)
    if names is None:
        raise SpecViolation(act, "not a step of the spec's transcription")
    return {names[k]: v for k, v in a.items() if k in names}


def _match(v: tuple, o: list) -> bool:
    kind = "noop" if is_noop(v) else "data"
    return kind == o[1] and (o[0] == 0 or origin_of(v) == o[0])


def _show(ents: dict) -> dict:
    return {n: [origin_of(v), "noop" if is_noop(v) else "data"] for n, v in sorted(ents.items())}


def _batched(e: dict, nxt: dict | None) -> bool:
    """A store of a batch but its last (one fsync: compared with the last)."""
    return nxt is not None and e["action"] in STORES and stored_with(e, nxt)


def _durable_at_restart(evs: list[dict]) -> list[dict]:
    """A real bookie is killed (SIGKILL): what it kept durable is known only
    from what it replays when it restarts (``BookieRestart`` reports it).
    Each crash takes the term of its bookie's next restart as the durable
    term (the model's BookieCrash checks that a crash raises nothing)."""
    for k, e in enumerate(evs):
        if e["action"] != "BookieCrash":
            continue
        b = e["args"]["bookie"]
        nxt = next((f for f in evs[k + 1:] if f["action"] == "BookieRestart" and f["args"]["bookie"] == b), None)
        if nxt is not None and b in nxt.get("bk", {}):
            e["args"] = dict(e["args"], durable_term=nxt["bk"][b]["term"])
    return evs


def replay(trace) -> ReplayVerdict:
    """The transcription's verdict on a whole trace (NDJSON text or events)."""
    evs = _events(trace)
    assert evs and evs[0]["action"] == "Header", "a trace starts with its Header"
    if evs[0]["args"].get("term_offset"):  # a real trace: its terms as the spec's (bookie/tracelog.py)
        evs = _durable_at_restart(shift_terms(evs, evs[0]["args"]["term_offset"]))
    r = Replay(evs[0]["args"], real=any("proc" in e for e in evs[1:]))
    for k, e in enumerate(evs[1:], 1):
        nxt = evs[k + 1] if k + 1 < len(evs) else None
        try:
            r.step(e, compare=not _batched(e, nxt))
        except SpecViolation as x:
            return ReplayVerdict(False, len(evs) - 1, k, e["action"], x.reason)
        except (KeyError, TypeError, ValueError, IndexError) as x:  # malformed: no step of the model takes it
            return ReplayVerdict(False, len(evs) - 1, k, e["action"], f"malformed: {x!r}")
    return ReplayVerdict(True, len(evs) - 1, None, None, None)


__all__ = ["Replay", "ReplayVerdict", "replay"]
