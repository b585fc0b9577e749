"""BookstreamFiner's behaviours (tla/BookstreamFiner.tla) replayed through
sim/spec.py: the finer spec's own steps, mapped onto the model's extension
actions (sim/spec_tlc.py does the protocol spec's).

TLC names every step of ``FinerNext`` (``MultiNext``: no channel, no
extension action) after the disjunct it
took (``<FinerNext line 197, ...>``), not after the action, so a step's
action is not known: every action of the finer spec is a candidate (its
parameters enumerated, the channel's request ``m`` taken from TLC's state
before the step), and the replay keeps the candidates that sim/spec.py
accepts and that reach TLC's next state.  The finer spec's steps:

=================  ==========================================================
TLC action         sim/spec.py steps
=================  ==========================================================
SendAdd(c, b, n)   ClientSendAdd (the record as the client has it now)
LiveStore(m, seen) BookieAdmit (accepted), BookieStore (m's record),
                   ClientAddAnswer (counted = seen)
StaleStore(m)      BookieAdmit (accepted), BookieStore; nobody counts it
DropRequest(m)     none (a request lost, or refused: the model's refusal
                   needs no step of the client)
StaleRead(b, t)    BookieRead (a LAC read of term t, nobody takes the answer)
StoreLac(b, l, f)  BookieWriteLac (accepted) then BookieStoreLac.  The spec's
                   StoreLac carries no term and checks no fence (a bookie's
                   LAC/LAFR rise to values a writer had); sim/spec.py admits an
                   explicit LAC as an add (term not below the bookie's, not
                   fenced, the ledger known): the replay sends it with the
                   bookie's own term, so that guard is not exercised here
                   (tla/README.md lists this refinement)
Withdraw(c)        Withdraw
Restart(b)         BookieRestart
RollFragment(c, e) BookiePrepare (each joining bookie), RollFragment
EnsembleChangeSet  as sim/spec_tlc.py's EnsembleChangeMap (several at once)
=================  ==========================================================

``msgs`` and ``hist`` are not compared: sim/spec.py keeps its own record of
the requests sent (``sent``), which ``BookieStore`` checks.
"""
from __future__ import annotations

from bookie import entry as E
from sim import spec_tlc as T
from sim.spec import Model

FINER_ACTIONS = ("WriterAdd", "WriterClose", "StartTakeover", "StartReading", "Finish", "NoticeTakeover",
                 "FenceReadH", "RecoveryReadH", "Rejected", "DeliverWith", "EnsembleChangeMap", "Crash")


def _request_record(m: dict, k: T.Consts) -> bytes:
    """The record a channel request carries (what its client sent)."""
    origin, kind = int(m["v"][0]), m["v"][1]
    flags = (E.FLAG_NOOP if kind == "noop" else 0) | (E.FLAG_TRUNCATE if m["trunc"] else 0)
    term = int(m["t"]) - k.shift
    return E.encode(T.LID, int(m["n"]), b"", lac=int(m["rl"]), lafr=int(m["rf"]), term=term, data_flags=flags,
                    req_flags=E.REQ_RECOVERY if m.get("rec") else 0, origin=origin - k.shift)


def _store(mod: Model, m: dict, k: T.Consts, seen: bool | None) -> None:
    rec, b = _request_record(m, k), str(m["b"])
    mod.BookieAdmit(b, E.parse_header(rec), True)
    mod.BookieStore(b, rec)
    if seen is not None:
        mod.ClientAddAnswer(str(m["c"]), b, int(m["n"]), seen)


def _roll(mod: Model, c: str, first: int, ens: tuple, k: T.Consts) -> None:
    w = mod.cl[c]
    for nb in sorted(set(ens) - set(w.frags[-1][1])):
        mod.BookiePrepare(nb, first, w.term, True)
    mod.RollFragment(c, first, ens)


def candidates(m: Model, s: dict, t: dict, k: T.Consts, ids: list[int], act: str = "FinerNext"):
    """Every action of FinerNext, parameters enumerated: the finer spec's own
    first (the first that matches names the step in the coverage counts),
    a dropped request last."""
    bs, cs = list(k.bookies), list(k.clients)
    if act == "MultiNext":  # (MultiSpec: the protocol spec's steps, several bookies changed at once)
        for a in FINER_ACTIONS + ("Terminate",):
            yield from T.candidates(a, m, s, t, k, ids)
        return
    for c in cs:
        w = m.cl[c]
        for n in sorted(w.val):
            for b in bs:
                yield f"SendAdd({c}, {b}, {n})", lambda mod, c=c, b=b, n=n: mod.ClientSendAdd(
                    c, b, n, T._record(mod, c, n))
        yield f"Withdraw({c})", lambda mod, c=c: mod.Withdraw(c)
        if w.frags and s["cl"][c]["frags"] and len(t["cl"][c]["frags"]) > len(s["cl"][c]["frags"]):
            new = t["cl"][c]["frags"][-1]
            ens = tuple(str(x) for x in (new["ens"] if k.striped else sorted(new["ens"])))
            yield f"RollFragment({c}, {ens})", lambda mod, c=c, f=int(new["first"]), e=ens: _roll(mod, c, f, e, k)
    for msg in sorted(s.get("msgs", ()), key=repr):
        for seen in (True, False) if k.lost_acks else (True,):
            yield f"LiveStore({dict(msg)}, seen={seen})", lambda mod, msg=msg, seen=seen: _store(mod, msg, k, seen)
        yield f"StaleStore({dict(msg)})", lambda mod, msg=msg: _store(mod, msg, k, None)
    for b in bs:
        x = m.bk[b]
        yield f"Restart({b})", lambda mod, b=b: mod.BookieRestart(b)
        yield f"StoreLac({b})", lambda mod, b=b: (
            mod.BookieWriteLac(b, mod.bk[b].term, True, True),
            mod.BookieStoreLac(b, t["bk"][b]["lac"], t["bk"][b]["lafr"]))
        for term in range(x.term + 1, max(m.meta.term, x.term) + 1):
            yield f"StaleRead({b}, {term})", lambda mod, b=b, term=term: mod.BookieRead(
                b, term, not k.unbounded, "OK", None)
        if not k.unbounded and not x.fenced:
            yield f"StaleRead({b}, fence)", lambda mod, b=b: mod.BookieRead(b, mod.meta.term, True, "OK", None)
    for act in FINER_ACTIONS:
        yield from T.candidates(act, m, s, t, k, ids)
    for msg in sorted(s.get("msgs", ()), key=repr):
        yield f"DropRequest({dict(msg)})", lambda mod: None



__all__ = ["candidates", "FINER_ACTIONS"]
