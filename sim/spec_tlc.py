"""Behaviours that TLC generates from tla/BookstreamLedger.tla, replayed
through sim/spec.py's ``Model`` (issue 14 item 5: one source of truth).

sim/spec_replay.py and tla/differential.py compare the two checkers on the
*implementation's* traces; TLC's trace validation of those traces finds a
transcription laxer than the spec.  Here the input is the spec's own
behaviours (tla/behaviours.py runs TLC in simulation mode and parses its
error traces, tla/tlcvalues.py), so a rule sim/spec.py has and the spec
lacks (the transcription stricter than the spec: it refuses a real spec
behaviour) shows up as a refused step or a differing state.

The model starts in TLC's initial state (the constants of the
configuration; the initial ensemble as TLC chose it).  Each TLC step is
mapped onto the sequence of sim/spec.py's finer steps that the coarse step
stands for (its docstring's "Granularity"), with the parameters the action
name leaves open (client, bookie, entry, seen/heard, the replacement)
enumerated: a candidate is taken when every finer step is accepted and the
model then maps onto TLC's next state on every spec variable (``view``).
Several candidates may match (they differ only in the model's own
book-keeping): all are kept, up to ``BEAM``, and the replay fails only
when none of them can take a step.  An action this module does not know is
an ``UnmappedAction``, never a pass.  BookstreamFiner's behaviours (TLC
names their steps ``FinerNext``/``MultiNext``): sim/spec_tlc_finer.py.

The coarse steps and their finer sequences:

=================  ==========================================================
TLC action         sim/spec.py steps
=================  ==========================================================
WriterAdd(c)       WriterAdd (the value: ``("data", b"", term)``, Data(t))
DeliverWith(c, b,  ClientSendAdd (the record as the client has it: its LAC,
  n, seen)         LAFR, term, flags), BookieAdmit (accepted), BookieStore,
                   ClientAddAnswer (counted = seen)
Rejected(c, b)     a refused request, then Rejected(c): an add of a pending
                   entry (BookieAdmit refuses), an explicit LAC (an open
                   writer: BookieWriteLac refuses), a fencing read or a
                   recovery read (BookieRead answers INVALID_TERM); the
                   spec's Rejected abstracts "some request to b was
                   refused", so any one of them is the step.  With no
                   request to b the model could send (a finishing client
                   b already acked): NoticeTakeover, same effect, enabled
                   whenever Rejected is (``candidates``).  TLC itself never
                   prints Rejected: it names a step by the first action
                   of Next that takes it, and NoticeTakeover comes first
NoticeTakeover(c)  NoticeTakeover
StartTakeover(c)   StartTakeover (term: metadata term + 1; classic: the same)
FenceReadH(c, b,   ClientSendRead (LAC), BookieRead (OK), the answer
  heard)           (``answered``), ClientFenceAnswer if heard
StartReading(c)    StartReading (from TLC's ``next``)
RecoveryReadH(c,   ClientSendRead (entry next), BookieRead (OK or
  b, heard)        NO_SUCH_ENTRY), ``answered``, and if heard
                   ClientReadAnswer, then RecoveryDecide when the answers
                   decide next (a fresh value: recovered; Coverage
                   NoSuchEntry: absent, or data_loss at or below the
                   frozen LAC, DEVIATIONS["data_loss_abort"])
Finish(c)          Finish
WriterClose(c)     WriterClose (last: the writer's LAC)
EnsembleChangeMap  BookiePrepare (each joining bookie, unbounded), DropAcks
  (c, rep)         (a writer's proposal), EnsembleChange
Crash(b)           BookieCrash (durable term and fence: the bookie's; the
                   spec's bookies fsync before they answer)
Terminate          none (a stutter)
=================  ==========================================================

What the comparison leaves out, and why (each explicit in ``view``):

- the model's own book-keeping, not a spec variable: ``answers``, ``sent``,
  ``stored``, a bookie's ``read_term`` and ``prepared``, a client's
  ``rfrags`` beyond its last ensemble, ``start``, ``proposed``, ``okfrom``,
  the read-ahead answers above ``next`` (the spec reads only at next);
- ``rens`` outside recovery: the spec's is ``NoEns`` (it has no meaning
  there); the model keeps the fragments there (``rfrags = frags``);
- classic mode: the implementation's classic ledgers have term 0 and the
  spec's metadata term 1 (tla/tracecheck.py shifts the same way), so the
  metadata's, an active client's and a value's origin term are the model's
  + 1; a bookie's term is 0 in both.  The recovery's ``floor`` is not
  compared in classic mode: every origin is the same term there, so the
  model's floor stays 0 where the spec's becomes 1 (no stale value exists).
"""
from __future__ import annotations

import copy
import itertools
import pickle
from dataclasses import dataclass, field

from bookie import entry as E
from sim.metadata import LedgerMeta
from sim.spec import DEVIATIONS, Model, SpecViolation, is_noop, origin_of

LID = 1
BEAM = 8
NOVAL = (0, "none")
RECOVERING = ("fencing", "reading", "finishing")


class UnmappedAction(RuntimeError):
    """A TLC action the replayer cannot map onto sim/spec.py's steps."""


@dataclass(frozen=True)
class Consts:
    """A configuration's constants (tla/models/*.cfg)."""
    bookies: tuple
    ensemble0: tuple
    clients: tuple
    creator: str
    WQ: int
    AQ: int
    mode: str
    inflight: int
    lost_acks: bool

    @property
    def unbounded(self) -> bool:
        return self.mode == "unbounded"

    @property
    def striped(self) -> bool:
        return self.WQ < len(self.ensemble0)

    @property
    def shift(self) -> int:  # spec term = model term + shift (classic: 1)
        return 0 if self.unbounded else 1


@dataclass
class Verdict:
    accepted: bool
    steps: int                     # TLC steps (after the initial state)
    failed_at: int | None = None   # the TLC step (1 = the first after Init)
    action: str | None = None
    reason: str | None = None
    prefix: list = field(default_factory=list)   # the TLC actions up to the failure
    candidates: int = 0            # candidates tried in the whole behaviour
    deviation: str | None = None   # a listed DEVIATIONS key that explains the failure
    kinds: dict = field(default_factory=dict)    # the kinds of step taken (``kind``) -> count

    def describe(self) -> str:
        if self.accepted:
            return f"accepted: {self.steps} steps"
        return (f"REFUSED at TLC step {self.failed_at} of {self.steps} ({self.action})"
                + (f" [listed deviation {self.deviation}]" if self.deviation else "")
                + f": {self.reason}\n  behaviour prefix: {' -> '.join(self.prefix)}")


# -- TLC's state, and the model's, as comparable plain values -----------------------------

def _ens(x, striped: bool):
    return tuple(str(b) for b in x) if striped else frozenset(str(b) for b in x)


def _frags(fs, striped: bool) -> tuple:
    return tuple((int(f["first"]), _ens(f["ens"], striped)) for f in fs)


def tlc_view(s: dict, k: Consts) -> dict:
    """TLC's state with NoVal entries and empty ack sets left out."""
    st = k.striped
    out = {
        "bk": {str(b): {"term": v["term"], "fenced": v["fenced"], "lac": v["lac"], "lafr": v["lafr"],
                        "ents": {n: tuple(x) for n, x in v["ents"].items() if tuple(x) != NOVAL}}
               for b, v in s["bk"].items()},
        "crashed": frozenset(str(b) for b in s["crashed"]),
        "meta": {"state": s["meta"]["state"], "term": s["meta"]["term"], "frags": _frags(s["meta"]["frags"], st),
                 "last": s["meta"]["last"]},
        "acked": frozenset((int(p[0]), tuple(p[1])) for p in s["acked"]),
        "cl": {},
    }
    for c, w in s["cl"].items():
        out["cl"][str(c)] = {
            "phase": w["phase"], "term": w["term"], "frags": _frags(w["frags"], st),
            "lac": w["lac"], "lafr": w["lafr"], "lap": w["lap"],
            "val": {n: tuple(x) for n, x in w["val"].items() if tuple(x) != NOVAL},
            "ack": {n: frozenset(str(b) for b in x) for n, x in w["ack"].items() if x},
            "fenced": frozenset(str(b) for b in w["fenced"]), "next": w["next"],
            "nosuch": frozenset(str(b) for b in w["nosuch"]),
            "floor": w["floor"] if k.unbounded else None,
            "rens": _ens(w["rens"], st),
        }
    return out


def _sv(v: tuple, k: Consts) -> tuple:
    """A model value as the spec's <<origin, kind>>."""
    return (origin_of(v) + k.shift, "noop" if is_noop(v) else "data")


def view(m: Model, k: Consts) -> dict:
    """The model mapped onto the spec's variables (sim/spec.py's table)."""
    st = k.striped
    no_ens = () if st else frozenset()
    out = {
        "bk": {b: {"term": x.term, "fenced": x.fenced, "lac": x.lac, "lafr": x.lafr,
                   "ents": {n: _sv(v, k) for n, v in x.ents.items()}} for b, x in m.bk.items()},
        "crashed": frozenset(m.crashed),
        "meta": {"state": m.meta.state, "term": m.meta.term + k.shift,
                 "frags": tuple((f, _ens(e, st)) for f, e in m.meta.frags), "last": m.meta.last},
        "acked": frozenset((n, _sv(v, k)) for n, v in m.acked.items()),
        "cl": {},
    }
    for c, w in m.cl.items():
        got = w.ahead.get(w.next) if w.phase == "reading" else None
        out["cl"][c] = {
            "phase": w.phase, "term": w.term + (k.shift if w.phase != "idle" else 0),
            "frags": tuple((f, _ens(e, st)) for f, e in w.frags),
            "lac": w.lac, "lafr": w.lafr, "lap": w.lap,
            "val": {n: _sv(v, k) for n, v in w.val.items()},
            "ack": {n: frozenset(s) for n, s in w.ack.items() if s},
            "fenced": frozenset(w.fenced), "next": w.next,
            # the spec's nosuch: the NoSuchEntry answers for next (read-ahead above it: the model's own)
            "nosuch": frozenset(got) if isinstance(got, set) else frozenset(),
            "floor": w.floor if k.unbounded else None,
            # rens: the read ensemble during recovery; the spec's NoEns otherwise
            "rens": _ens(w.rfrags[-1][1], st) if w.phase in RECOVERING else no_ens,
        }
    return out


def diff(a: dict, b: dict, path: str = "") -> list[str]:
    """Where the model's view a and TLC's b differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                out.append(f"{path}.{key}: model {a.get(key, '-')}, TLC {b.get(key, '-')}")
            else:
                out += diff(a[key], b[key], f"{path}.{key}" if path else str(key))
        return out
    return [] if a == b else [f"{path}: model {_show(a)}, TLC {_show(b)}"]


def _show(x):
    if isinstance(x, frozenset):
        return "{" + ", ".join(sorted(map(str, x))) + "}"
    return x


# -- the model in TLC's initial state ----------------------------------------------------

def initial_model(s0: dict, k: Consts) -> Model:
    fr = tuple((int(f["first"]), tuple(str(b) for b in (f["ens"] if k.striped else sorted(f["ens"]))))
               for f in s0["meta"]["frags"])
    meta = LedgerMeta(state=s0["meta"]["state"], term=s0["meta"]["term"] - k.shift, frags=fr,
                      last=s0["meta"]["last"], E=len(k.ensemble0), Qw=k.WQ, Qa=k.AQ)
    return Model(bookies=list(k.bookies), E=len(k.ensemble0), Qw=k.WQ, Qa=k.AQ, unbounded=k.unbounded,
                 meta=meta, clients=list(k.clients), creator=k.creator)


# -- the finer steps of each coarse step ---------------------------------------------------

def _record(m: Model, c: str, n: int) -> bytes:
    """Entry n as client c sends it now (the spec's Deliver: its LAC, LAFR, term)."""
    w = m.cl[c]
    v = w.val[n]
    flags = (E.FLAG_NOOP if is_noop(v) else 0) | (E.FLAG_TRUNCATE if m.truncate_flag(w, n) else 0)
    return E.encode(LID, n, b"", lac=w.lac, lafr=w.lafr, term=w.term, data_flags=flags,
                    req_flags=E.REQ_RECOVERY if w.phase != "open" else 0, origin=origin_of(v))


def deliver(m: Model, c: str, b: str, n: int, seen: bool) -> None:
    rec = _record(m, c, n)
    m.ClientSendAdd(c, b, n, rec)
    m.BookieAdmit(b, E.parse_header(rec), True)
    m.BookieStore(b, rec)
    m.ClientAddAnswer(c, b, n, seen)


def fence_read(m: Model, c: str, b: str, heard: bool, k: Consts) -> None:
    w, fence = m.cl[c], not k.unbounded   # (unbounded reads carry the term, not the fence flag)
    m.ClientSendRead(c, b, None, w.term, fence)
    m.BookieRead(b, w.term, fence, "OK", None)
    x = m.bk[b]
    m.answered(b, None, w.term, (x.lac, x.lafr))
    if heard:
        m.ClientFenceAnswer(c, b, x.lac, x.lafr)


def recovery_read(m: Model, c: str, b: str, heard: bool, k: Consts) -> None:
    w, fence = m.cl[c], not k.unbounded
    n = w.next
    m.ClientSendRead(c, b, n, w.term, fence)
    m.BookieRead(b, w.term, fence, "OK" if n in m.bk[b].ents else "NO_SUCH_ENTRY", n)
    ans = m.bk[b].ents.get(n)
    m.answered(b, n, w.term, ans)
    if not heard:
        return
    m.ClientReadAnswer(c, b, n, ans)
    got = w.ahead.get(n)
    if got is not None and not isinstance(got, set):
        m.RecoveryDecide(c, n, "recovered")
    elif isinstance(got, set) and len(got) >= m.coverage:
        # the spec ends the recovery here whatever the frozen LAC; the
        # implementation aborts at or below it (DEVIATIONS["data_loss_abort"]):
        # "absent" is what the spec did, and the model refuses it there
        m.RecoveryDecide(c, n, "absent")


def rejected(m: Model, c: str, b: str, how: tuple, k: Consts) -> None:
    w = m.cl[c]
    kind = how[0]
    if kind == "add":
        rec = _record(m, c, how[1])
        m.ClientSendAdd(c, b, how[1], rec)
        m.BookieAdmit(b, E.parse_header(rec), False)
    elif kind == "lac":
        m.ClientSendLac(c, b, w.lac, w.lafr, w.term)
        m.BookieWriteLac(b, w.term, True, False)
    else:  # a fencing read (how[1] None) or a recovery read of entry how[1]
        fence = not k.unbounded
        m.ClientSendRead(c, b, how[1], w.term, fence)
        m.BookieRead(b, w.term, fence, "INVALID_TERM", how[1])
    m.Rejected(c)


def ensemble_change(m: Model, c: str, first: int, ens: tuple, replaced: dict, k: Consts) -> None:
    w = m.cl[c]
    if k.unbounded:  # the spec's change prepares each joining bookie: a bookie step of its own here
        for nb in sorted(set(replaced.values())):
            m.BookiePrepare(nb, first, w.term, True)
    if w.phase == "open":  # the writer's proposal (its failed bookies' acks dropped), then the CAS
        m.DropAcks(c, set(replaced), first, True)
    m.EnsembleChange(c, first, ens, replaced)


def candidates(act: str, m: Model, s: dict, t: dict, k: Consts, ids: list[int]):
    """(description, step function) for each way the model may take TLC's
    step ``act`` from s to t."""
    changed_cl = [str(c) for c in s["cl"] if s["cl"][c] != t["cl"][c]]
    cs = changed_cl or list(k.clients)
    bs = list(k.bookies)
    seen_opts = (True, False) if k.lost_acks else (True,)
    if act == "WriterAdd":
        for c in cs:
            yield f"WriterAdd({c})", lambda m, c=c: m.WriterAdd(
                c, m.cl[c].lap + 1, ("data", b"", m.cl[c].term), k.inflight)
    elif act in ("DeliverWith", "Deliver", "AckFrom"):
        for c in list(k.clients):
            for n in sorted(m.cl[c].val):
                for b in bs:
                    for seen in seen_opts:
                        yield f"Deliver({c}, {b}, {n}, seen={seen})", \
                            lambda m, c=c, b=b, n=n, seen=seen: deliver(m, c, b, n, seen)
    elif act in ("FenceReadH", "FenceRead", "RecoveryReadH", "RecoveryRead"):
        fn = fence_read if act.startswith("Fence") else recovery_read
        for c in cs:
            for b in bs:
                for heard in seen_opts:
                    yield f"{act}({c}, {b}, heard={heard})", \
                        lambda m, c=c, b=b, heard=heard, fn=fn: fn(m, c, b, heard, k)
    elif act == "Rejected":
        for c in cs:
            w = m.cl[c]
            for b in bs:
                hows = [("add", n) for n in sorted(w.val)]
                if w.phase == "open":
                    hows.append(("lac",))
                if w.phase == "fencing":
                    hows.append(("read", None))
                if w.phase == "reading":
                    hows += [("read", n) for n in ids if n >= w.next]
                for how in hows:
                    yield f"Rejected({c}, {b}) via a refused {how}", \
                        lambda m, c=c, b=b, how=how: rejected(m, c, b, how, k)
            # The spec's Rejected needs no request outstanding to b (a finishing
            # client whose adds b all acked may be refused by b); the
            # implementation then hears of the take-over from the metadata.
            # Same effect, and the spec's Rejected(c, b) implies NoticeTakeover(c)
            # is enabled (unbounded: b's higher term came from a take-over that
            # raised the metadata's; classic: a fenced bookie means the ledger is
            # no longer OPEN), which the model's NoticeTakeover guard checks.
            yield f"Rejected({c}) as NoticeTakeover (no request the model could have refused)", \
                lambda m, c=c: m.NoticeTakeover(c)
    elif act in ("NoticeTakeover", "Finish"):
        for c in cs:
            yield f"{act}({c})", lambda m, c=c: getattr(m, act)(c)
    elif act == "StartTakeover":
        for c in cs:
            yield f"StartTakeover({c})", lambda m, c=c: m.StartTakeover(
                c, m.meta.term + 1 if k.unbounded else m.meta.term)
    elif act == "StartReading":
        for c in cs:
            yield f"StartReading({c})", lambda m, c=c: m.StartReading(c, t["cl"][c]["next"])
    elif act == "WriterClose":
        for c in cs:
            yield f"WriterClose({c})", lambda m, c=c: m.WriterClose(c, m.cl[c].lac)
    elif act in ("EnsembleChangeMap", "EnsembleChange", "EnsembleChangeSet"):
        for c in cs:
            if not t["cl"][c]["frags"] or not m.cl[c].frags:
                continue
            new = t["cl"][c]["frags"][-1]
            first, old = int(new["first"]), m.cl[c].frags[-1][1]
            if k.striped:
                ens = tuple(str(b) for b in new["ens"])
                rep = {a: x for a, x in zip(old, ens) if a != x}
                pairings = [rep] if len(ens) == len(old) else []
            else:
                nset = {str(b) for b in new["ens"]}
                out, ins = sorted(set(old) - nset), sorted(nset - set(old))
                pairings = [dict(zip(out, p)) for p in itertools.permutations(ins)] if len(out) == len(ins) else []
            for rep in pairings:
                if not rep:  # (no bookie replaced: not a change)
                    continue
                ens = tuple(rep.get(b, b) for b in old)
                yield f"EnsembleChange({c}, {rep}, first {first})", \
                    lambda m, c=c, first=first, ens=ens, rep=rep: ensemble_change(m, c, first, ens, rep, k)
    elif act == "Crash":
        for b in sorted({str(x) for x in t["crashed"]} - {str(x) for x in s["crashed"]}) or bs:
            yield f"Crash({b})", lambda m, b=b: m.BookieCrash(b, m.bk[b].term, m.bk[b].fenced)
    elif act == "Terminate":
        yield "Terminate", lambda m: None
    else:
        raise UnmappedAction(f"TLC action {act!r} has no mapping onto sim/spec.py's steps")


def kind(act: str, s: dict, t: dict, desc: str) -> str:
    """What kind of step a TLC step was (coverage: lost acks, unheard
    reads, a recovery's decision, a recovery's ensemble change)."""
    ch = [c for c in s["cl"] if s["cl"][c] != t["cl"][c]]
    w, w2 = (s["cl"][ch[0]], t["cl"][ch[0]]) if ch else (None, None)
    if act in ("DeliverWith", "Deliver"):
        return f"Deliver[{'seen' if 'seen=True' in desc else 'ack lost'}, {w['phase'] if w else 'unseen'}]"
    if act in ("FenceReadH", "RecoveryReadH"):
        if w is None:
            return f"{act}[unheard]"
        if act == "FenceReadH":
            return f"{act}[heard]"
        out = ("absent" if w2["phase"] == "finishing" else "recovered" if w2["next"] != w["next"]
               else "NoSuchEntry")
        b = desc.split("(")[1].split(",")[1].strip()
        if out != "recovered" and tuple(s["bk"][b]["ents"][w["next"]]) != NOVAL:
            out += ", a stale value"  # an OK below the floor: counted as NoSuchEntry
        return f"{act}[{out}]"
    if act.startswith("EnsembleChange"):
        return f"{act}[{w['phase'] if w else '?'}]"
    if act in ("SendAdd", "LiveStore", "StaleStore", "DropRequest", "StaleRead", "StoreLac", "Withdraw",
               "Restart", "RollFragment"):
        return f"{act}[finer]"
    if act == "NoticeTakeover":
        return f"NoticeTakeover[{w['phase'] if w else '?'}]"
    if act == "Rejected":
        return f"Rejected[{'as NoticeTakeover' if 'NoticeTakeover' in desc else 'refused request'}]"
    return act


FINER_NEXT = ("FinerNext", "MultiNext")  # BookstreamFiner: TLC names a step after its disjunct


def _candidates(act: str, m: Model, s: dict, t: dict, k: Consts, ids: list[int]):
    if act in FINER_NEXT:
        from sim import spec_tlc_finer  # (it builds on this module)
        return spec_tlc_finer.candidates(m, s, t, k, ids, act)
    return candidates(act, m, s, t, k, ids)


_NAMES = {"Deliver": "DeliverWith", "EnsembleChange": "EnsembleChangeMap"}


def _key(m: Model) -> bytes:
    try:
        return pickle.dumps((m.bk, m.crashed, m.meta, m.cl, m.acked, sorted(m.answers.items(), key=repr),
                             sorted(m.sent.items(), key=repr), sorted(m.stored.items(), key=repr)))
    except Exception:  # (unpicklable: no dedup)
        return repr(id(m)).encode()


def _plausible(desc: str, s: dict, t: dict) -> bool:
    """Does the candidate name only clients and bookies whose state changed
    (a refusal report lists those first)?"""
    ch = {str(x) for x in s["cl"] if s["cl"][x] != t["cl"][x]} | \
         {str(x) for x in s["bk"] if s["bk"][x] != t["bk"][x]}
    names = {w.strip("(),") for w in desc.replace("(", " ").replace(",", " ").split()}
    actors = {x for x in names if x[:1] in "bc" and x[1:].isdigit()}
    return not ch or bool(actors & ch) or not actors


def replay(states: list, k: Consts) -> Verdict:
    """Replays one TLC behaviour (tla/tlcvalues.py ``State``s)."""
    models = [initial_model(states[0].vars, k)]
    d = diff(view(models[0], k), tlc_view(states[0].vars, k))
    prefix = ["Init"]
    if d:
        return Verdict(False, len(states) - 1, 0, "Init", "initial states differ: " + "; ".join(d[:6]), prefix)
    ids = sorted(states[0].vars["bk"][k.bookies[0]]["ents"]) if k.bookies else []
    tried, kinds = 0, {}
    for i in range(1, len(states)):
        s, t, act = states[i - 1].vars, states[i].vars, states[i].action
        prefix.append(act)
        tv = tlc_view(t, k)
        nxt, seen, fails, took = [], set(), [], None
        for m in models:
            for desc, fn in _candidates(act, m, s, t, k, ids):
                tried += 1
                m2 = copy.deepcopy(m)
                try:
                    fn(m2)
                except SpecViolation as x:
                    fails.append((desc, f"refused by {x.action}: {x.reason}"))
                    continue
                except (KeyError, IndexError, TypeError, ValueError) as x:  # no step of the model takes it
                    fails.append((desc, f"the model cannot take it: {x!r}"))
                    continue
                d = diff(view(m2, k), tv)
                if d:
                    fails.append((desc, "accepted, but the states differ: " + "; ".join(d[:6])))
                    continue
                key = _key(m2)
                took = took or desc
                if key not in seen and len(nxt) < BEAM:
                    seen.add(key)
                    nxt.append(m2)
        if not nxt:
            plaus = [f for f in fails if _plausible(f[0], s, t)] or fails
            dev = next((key for key in DEVIATIONS if key == "data_loss_abort" and
                        any("frozen LAC" in r for _, r in plaus)), None)
            reason = "no candidate step matches TLC's; " + (
                " | ".join(f"{dsc}: {r}" for dsc, r in plaus[:6]) if plaus else "no candidate at all")
            return Verdict(False, len(states) - 1, i, act, reason, prefix, tried, dev, kinds)
        models = nxt
        named = _NAMES.get(took.split("(")[0], took.split("(")[0]) if act in FINER_NEXT else act
        kd = kind(named, s, t, took)
        kinds[kd] = kinds.get(kd, 0) + 1
    return Verdict(True, len(states) - 1, None, None, None, prefix, tried, kinds=kinds)


__all__ = ["Consts", "Verdict", "UnmappedAction", "replay", "view", "tlc_view", "initial_model", "candidates",
           "diff"]
