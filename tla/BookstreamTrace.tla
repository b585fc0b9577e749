--------------------------- MODULE BookstreamTrace ---------------------------
(***************************************************************************)
(* Trace validation (Cirstea, Kuppe, Merz et al., "Validating Traces of    *)
(* Distributed Programs Against TLA+ Specifications", 2024): a behaviour   *)
(* of BookstreamLedger that explains an implementation trace.  The trace   *)
(* (a sequence of events exported by sim/trace.py, translated into a TLA+  *)
(* constant by tla/tracecheck.py) is consumed one event per step; each event is *)
(* mapped to the spec action it implements (or to a stutter, for the      *)
(* implementation's finer steps), with the variables the event reports    *)
(* checked after the step.  What the trace leaves open (which client a     *)
(* bookie step serves, whether an ack or a read answer was heard, the      *)
(* origin term of a written-back no-op) TLC resolves: the trace is valid   *)
(* iff some behaviour consumes it whole, i.e. TLC finds a state violating  *)
(* the invariant Unconsumed.                                               *)
(*                                                                         *)
(* Extension steps (not in the protocol spec; each only withdraws a        *)
(* client, or raises a bookie's LAC/LAFR to a writer's own, or brings a    *)
(* crashed bookie back): Withdraw, StoreLac, Restart.  tla/README.md lists *)
(* them with the rest of the mapping.                                      *)
(***************************************************************************)
EXTENDS BookstreamLedger, TraceData
\* TraceData (generated per trace by tla/tracecheck.py) defines Trace: <<event,
\* ...>>, records with the fields below, and the constants' values.

VARIABLES
    l,           \* the index of the next event to consume
    hist,        \* history: the highest LAC and LAFR a writer ever had
    msgs         \* adds sent and not yet stored: the channel to the bookies

tvars == <<vars, l, hist, msgs>>



\* Event fields: a (action), c (client or ""), b (bookie or ""), n (entry,
\* or -1), t (term), v (value), ok (a read accepted), trunc (the record's
\* truncate flag), rl, rf (the LAC/LAFR a record carries), h (the answer
\* heard: "yes", "no", "open"), hasbk, bk ([term, lac, lafr, ents]),
\* hasmeta, meta ([state, term, frags]), nb (a replacement bookie).
E0 == Trace[l]

\* An observed value: origin term 0 means "not known" (a written-back no-op).
Match(v, o) == IF o[1] = 0 THEN v[2] = o[2] ELSE v = o

ObsEnt(o, n) == IF n \in DOMAIN o.ents THEN o.ents[n] ELSE NoVal

\* Bookie b after the step is as the event reports (checkTerm: the term too;
\* the implementation raises a bookie's term when it admits an add, the spec
\* when it stores it, so the term is compared at stores and crashes only).
BookieIs(b, o, checkTerm) ==
  E0.hasbk =>
    /\ ~checkTerm \/ o.term < 0 \/ bk'[b].term = o.term   \* (-1: not known)
    /\ bk'[b].lac = o.lac
    /\ bk'[b].lafr = o.lafr
    /\ \A n \in Ids : Match(bk'[b].ents[n], ObsEnt(o, n))
    /\ \A n \in DOMAIN o.ents : n \in Ids

MetaIs(o) ==
    /\ meta'.state = o.state
    /\ meta'.term = o.term
    /\ Len(meta'.frags) = Len(o.frags)
    /\ \A i \in DOMAIN o.frags : meta'.frags[i] = o.frags[i]

Stutter == UNCHANGED vars

\* -- extension steps --------------------------------------------------------
\* A client gives up (recovery aborted for want of a bookie, data loss below
\* the LAC, a client crash): it only stops.
Withdraw(c) ==
    /\ cl[c].phase # "idle"
    /\ cl' = [cl EXCEPT ![c] = IdleClient]
    /\ UNCHANGED <<bk, crashed, meta, acked>>

\* An explicit LAC write: a bookie's LAC/LAFR go up to what a writer had
\* (the write may arrive after the writer is gone): hist, a history
\* variable, holds the highest LAC and LAFR any writer ever had.
StoreLac(b, lac, lafr) ==
    /\ lac <= hist.lac
    /\ lafr <= hist.lafr
    /\ bk' = [bk EXCEPT ![b].lac = Max2(@, lac), ![b].lafr = Max2(@, lafr)]
    /\ UNCHANGED <<crashed, meta, cl, acked>>

\* A crashed bookie answers again (with what it had: fsync before ack).
Restart(b) ==
    /\ b \in crashed
    /\ crashed' = crashed \ {b}
    /\ UNCHANGED <<bk, meta, cl, acked>>

\* An add leaves client c for bookie b: Deliver's client-side guard, taken
\* when the request is sent; the request keeps the client's value, term and
\* truncate flag of that moment.
SendAdd(e) ==
    LET w == cl[e.c] IN
    /\ w.phase \in {"open", "reading", "finishing"}
    /\ Match(w.val[e.n], e.v)
    /\ e.b \in WriteSet(e.n, w.frags)
    /\ ~Unbounded \/ w.term = e.t
    /\ TruncateFlag(w, e.n) = e.trunc
    /\ msgs' = msgs \cup {[c |-> e.c, b |-> e.b, n |-> e.n, v |-> w.val[e.n], t |-> w.term,
                           trunc |-> e.trunc, rl |-> e.rl, rf |-> e.rf]}
    /\ UNCHANGED vars

\* A request stored after its client withdrew, moved to another term,
\* released the entry or dropped the bookie: the bookie side of Deliver,
\* with what the request carried (the answer finds nobody who counts it).
StaleStore(e) ==
    \E m \in msgs :
        /\ m.b = e.b /\ m.n = e.n /\ Match(m.v, e.v) /\ m.trunc = e.trunc
        /\ m.rl = e.rl /\ m.rf = e.rf
        /\ LET w == cl[m.c] IN   \* the request is no longer live at its client
           ~(/\ w.phase \in {"open", "reading", "finishing"} /\ w.term = m.t
             /\ w.val[m.n] = m.v /\ m.b \notin w.ack[m.n] /\ m.b \in WriteSet(m.n, w.frags))
        /\ e.b \notin crashed
        /\ IF Unbounded THEN bk[e.b].term <= m.t ELSE TRUE
        /\ bk' = [bk EXCEPT ![e.b].term = IF Unbounded THEN m.t ELSE @,
                             ![e.b].ents = Store(@, m.n, m.v, m.trunc),
                             ![e.b].lac  = Max2(@, m.rl),
                             ![e.b].lafr = Max2(@, m.rf)]
        /\ UNCHANGED <<crashed, meta, cl, acked>>

\* A fencing or recovery read of a term some client took over with, reaching
\* a bookie after that client withdrew or moved on: the bookie side only.
StaleRead(e) ==
    /\ Unbounded
    /\ e.t <= meta.term
    /\ bk[e.b].term <= e.t
    /\ bk' = [bk EXCEPT ![e.b].term = e.t]
    /\ UNCHANGED <<crashed, meta, cl, acked>>

\* -- events -> spec actions ------------------------------------------------
\* Whether the answer reached the client: known from the trace ("yes" /
\* "no": an ack counted, a fencing answer taken) or left to TLC ("open").
HeardIn(e) == CASE e.h = "yes" -> {TRUE} [] e.h = "no" -> {FALSE} [] OTHER -> BOOLEAN

\* A store whose ack was not counted, of a copy the bookie already holds:
\* the spec's Deliver has no unheard form of it (a stutter there, but the
\* record may raise the LAC): taken as heard.
SeenIn(e, c) ==
    IF e.h = "no" /\ bk[e.b].ents[e.n] = cl[c].val[e.n] THEN {TRUE} ELSE HeardIn(e)

Step(e) ==
    CASE e.a = "StartTakeover"  -> StartTakeover(e.c) /\ meta'.term = e.t
      [] e.a = "NoticeTakeover" -> NoticeTakeover(e.c)
      [] e.a = "Rejected"       -> \E b \in Bookies : Rejected(e.c, b)
      [] e.a = "Withdraw"       -> Withdraw(e.c) \/ (cl[e.c].phase = "idle" /\ Stutter)
      [] e.a = "Finish"         -> Finish(e.c)
      [] e.a = "WriterClose"    -> WriterClose(e.c)
      [] e.a = "WriterAdd"      -> WriterAdd(e.c) /\ cl'[e.c].lap = e.n
      [] e.a = "StartReading"   -> StartReading(e.c) /\ cl'[e.c].next = e.n
      [] e.a = "RecoveryDecide" -> \* decided by the reads TLC placed before
                                   /\ cl[e.c].phase \in {"reading", "finishing", "idle"}
                                   /\ cl[e.c].phase = "reading" => cl[e.c].next > e.n
                                   /\ Stutter
      [] e.a = "ClientSendAdd"  -> SendAdd(e)
      [] e.a = "BookieStore"    ->
            /\ \/ \E c \in IF e.c = "" THEN Clients ELSE {e.c} : \E seen \in SeenIn(e, c) :
                     /\ Match(cl[c].val[e.n], e.v)
                     /\ DeliverWith(c, e.b, e.n, seen, e.rl, e.rf)
                     /\ TruncateFlag(cl[c], e.n) = e.trunc
               \/ StaleStore(e)
            /\ BookieIs(e.b, e.bk, TRUE)
      [] e.a = "BookieRead"     ->
            /\ \/ /\ e.ok
                  /\ \/ \E c \in IF e.c = "" THEN Clients ELSE {e.c} : \E heard \in HeardIn(e) :
                           /\ ~Unbounded \/ cl[c].term = e.t
                           /\ IF e.n < 0 THEN FenceReadH(c, e.b, heard) ELSE RecoveryReadH(c, e.b, heard)
                     \/ StaleRead(e)
               \/ Stutter   \* refused (InvalidTerm), or a read that changes nothing
            /\ BookieIs(e.b, e.bk, FALSE)
      [] e.a = "EnsembleChange" ->
            \E b, nb \in Bookies :
                /\ e.nb = nb
                /\ EnsembleChange(e.c, b, nb)
                /\ LastFrag(cl'[e.c].frags).first = e.n
                /\ e.hasmeta => MetaIs(e.meta)
      [] e.a = "BookieCrash"    -> Crash(e.b) /\ BookieIs(e.b, e.bk, TRUE)
      [] e.a = "BookieRestart"  -> Restart(e.b)
      [] e.a = "BookieStoreLac" -> StoreLac(e.b, e.rl, e.rf) /\ BookieIs(e.b, e.bk, FALSE)
      [] OTHER                  -> Stutter   \* sends, admissions, answers, acks dropped

TraceInit == Init /\ l = 1 /\ hist = [lac |-> -1, lafr |-> -1] /\ msgs = {}

TraceNext ==
    /\ l <= Len(Trace)
    /\ Step(Trace[l])
    /\ Trace[l].a # "ClientSendAdd" => UNCHANGED msgs
    /\ l' = l + 1
    /\ hist' = [lac  |-> MaxOf({hist.lac} \cup {cl'[c].lac : c \in {d \in Clients : cl'[d].phase = "open"}}),
                lafr |-> MaxOf({hist.lafr} \cup {cl'[c].lafr : c \in {d \in Clients : cl'[d].phase = "open"}})]

TraceSpec == TraceInit /\ [][TraceNext]_tvars

\* Violated (by TLC) exactly when the whole trace has been consumed: the
\* trace is a behaviour of the spec.
Unconsumed == l <= Len(Trace)
=============================================================================
