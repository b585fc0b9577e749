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
(* bookie step serves, whether an ack or a read answer was heard where the *)
(* trace does not say, the origin term of a written-back no-op) TLC        *)
(* resolves (tla8: the simulator's traces pin the recovery answers each    *)
(* decision used and each joining bookie's prepare): the trace is valid   *)
(* iff some behaviour consumes it whole, i.e. TLC finds a state violating  *)
(* the invariant Unconsumed.                                               *)
(*                                                                         *)
(* The steps BookstreamLedger abstracts (late stores and reads, explicit   *)
(* LAC, give-ups, restarts) are BookstreamFiner's, model-checked there;   *)
(* the trace's channel only remembers every request sent (a live store is *)
(* DeliverWith, a stale one StoreLate).  tla/README.md has the mapping.    *)
(***************************************************************************)
EXTENDS BookstreamFiner, TraceData
\* TraceData (generated per trace by tla/tracecheck.py) defines Trace: <<event,
\* ...>>, records with the fields below, and the constants' values.

VARIABLES
    l,           \* the index of the next event to consume
    prep         \* each bookie's last accepted BookiePrepare: <<first, term>>
\* (msgs: every add request sent; hist: the highest LAC/LAFR a writer had)

tvars == <<vars, l, hist, msgs, prep>>



\* Event fields: a (action), c (client or ""), b (bookie or ""), n (entry,
\* or -1), t (term), v (value), ok (a read accepted), trunc (the record's
\* truncate flag), rl, rf (the LAC/LAFR a record carries), h (the answer
\* heard: "yes", "no", "open"), hasbk, bk ([term, lac, lafr, ents]),
\* hasmeta, meta ([state, term, frags], each ensemble a sequence), rep (an
\* ensemble change: each replaced bookie -> the bookie that takes its
\* position; one or several), ens (a roll's new ensemble, a sequence), ans
\* (the bookies whose answers a RecoveryDecide may use).
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
    /\ \A i \in DOMAIN o.frags : meta'.frags[i] = [first |-> o.frags[i].first, ens |-> Canon(o.frags[i].ens)]

Stutter == UNCHANGED vars

\* An add leaves client c for bookie b: Deliver's client-side guard, taken
\* when the request is sent; the request keeps the client's value, term and
\* truncate flag of that moment.
TraceSendAdd(e) ==
    LET w == cl[e.c] IN
    /\ w.phase \in {"open", "reading", "finishing"}
    /\ Match(w.val[e.n], e.v)
    /\ e.b \in Targets(w, e.n)
    /\ ~Unbounded \/ w.term = e.t
    /\ TruncateFlag(w, e.n) = e.trunc
    /\ msgs' = msgs \cup {[c |-> e.c, b |-> e.b, n |-> e.n, v |-> w.val[e.n], t |-> w.term,
                           trunc |-> e.trunc, rl |-> e.rl, rf |-> e.rf, rec |-> w.phase # "open"]}
    /\ UNCHANGED vars

\* A request stored after its client withdrew, moved to another term,
\* released the entry or dropped the bookie: BookstreamFiner's StoreLate.
TraceStaleStore(e) ==
    \E m \in msgs :
        /\ m.b = e.b /\ m.n = e.n /\ Match(m.v, e.v) /\ m.trunc = e.trunc
        /\ m.rl = e.rl /\ m.rf = e.rf
        /\ ~Live(m)
        /\ StoreLate(m)

\* A store whose ack was not counted, of a copy the bookie already holds
\* (SeenIn below may also take it as heard): all it changes is the bookie's
\* LAC/LAFR, to values the writer had, BookstreamFiner's StoreLac.  Taken
\* as heard only, the client's LAC could pass the implementation's: a
\* writer that dropped that bookie's acks when it proposed replacing it
\* (the spec's EnsembleChange drops them when it publishes) then changes
\* the ensemble from a first entry the spec's writer no longer has.
DuplicateUnheard(e) ==
    /\ e.h = "no"
    /\ \E c \in IF e.c = "" THEN Clients ELSE {e.c} :
          /\ cl[c].phase \in {"open", "reading", "finishing"}
          /\ Match(cl[c].val[e.n], e.v)
          /\ bk[e.b].ents[e.n] = cl[c].val[e.n]
    /\ StoreLac(e.b, e.rl, e.rf)

\* -- events -> spec actions ------------------------------------------------
\* Whether the answer reached the client: known from the trace ("yes" /
\* "no": an ack counted, a fencing answer taken) or left to TLC ("open").
HeardIn(e) == CASE e.h = "yes" -> {TRUE} [] e.h = "no" -> {FALSE} [] OTHER -> BOOLEAN

\* A store whose ack was not counted, of a copy the bookie already holds:
\* the spec's Deliver has no unheard form of it (a stutter there, but the
\* record may raise the LAC): taken as heard.
SeenIn(e, c) ==
    IF e.h = "no" /\ bk[e.b].ents[e.n] = cl[c].val[e.n] THEN {TRUE} ELSE HeardIn(e)

\* The spec's change or roll prepares its joining bookies in its own step; the
\* implementation prepares each before (a BookiePrepare event, a stutter
\* here but remembered in prep).  Where the trace has those events (the
\* simulator's: PreparesTraced), each joining bookie's last accepted one must
\* be at (the new fragment's first entry, the client's term): an unprepared
\* bookie is rejected at the change, whatever it holds (issue 14,
\* join_unprepared).
Prepared(c, first, joining) ==
    ~(Unbounded /\ PreparesTraced) \/ \A nb \in joining : prep[nb] = <<first, cl[c].term>>

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
      [] e.a = "ClientSendAdd"  -> TraceSendAdd(e)
      [] e.a = "BookieStore"    ->
            /\ \/ \E c \in IF e.c = "" THEN Clients ELSE {e.c} : \E seen \in SeenIn(e, c) :
                     /\ Match(cl[c].val[e.n], e.v)
                     /\ DeliverWith(c, e.b, e.n, seen, e.rl, e.rf)
                     /\ TruncateFlag(cl[c], e.n) = e.trunc
               \/ TraceStaleStore(e)
               \/ DuplicateUnheard(e)
            /\ BookieIs(e.b, e.bk, TRUE)
      [] e.a = "BookieRead"     ->
            /\ \/ /\ e.ok
                  /\ \/ \E c \in IF e.c = "" THEN Clients ELSE {e.c} : \E heard \in HeardIn(e) :
                           /\ ~Unbounded \/ cl[c].term = e.t
                           /\ IF e.n < 0 THEN FenceReadH(c, e.b, heard)
                              ELSE /\ e.n = cl[c].next   \* (a read-ahead read is not a read of next: tla8)
                                   /\ RecoveryReadH(c, e.b, heard)
                     \/ StaleRead(e.b, e.t)
               \/ Stutter   \* refused (InvalidTerm), or a read that changes nothing
            /\ BookieIs(e.b, e.bk, FALSE)
      [] e.a = "EnsembleChange" ->   \* one bookie or several replaced (rep)
            /\ Prepared(e.c, e.n, Range(e.rep))
            /\ EnsembleChangeMap(e.c, e.rep)
            /\ LastFrag(cl'[e.c].frags).first = e.n
            /\ e.hasmeta => MetaIs(e.meta)
      [] e.a = "RollFragment"   ->
            /\ Prepared(e.c, e.n, Range(e.ens) \ Members(LastFrag(cl[e.c].frags).ens))
            /\ RollFragment(e.c, Canon(e.ens))
            /\ LastFrag(cl'[e.c].frags).first = e.n
            /\ e.hasmeta => MetaIs(e.meta)
      [] e.a = "BookieCrash"    -> Crash(e.b) /\ BookieIs(e.b, e.bk, TRUE)
      [] e.a = "BookieRestart"  -> Restart(e.b) /\ BookieIs(e.b, e.bk, TRUE)   \* (what it replayed: rtrace9)
      [] e.a = "BookieStoreLac" -> StoreLac(e.b, e.rl, e.rf) /\ BookieIs(e.b, e.bk, FALSE)
      [] OTHER                  -> Stutter   \* sends, admissions, answers, acks dropped

TraceInit == Init /\ l = 1 /\ prep = [b \in Bookies |-> <<-1, 0>>] /\ hist = [lac |-> -1, lafr |-> -1] /\ msgs = {} /\ TLCSet(1, 1)

\* Reports how far some behaviour got (tracecheck.py reads the last line;
\* TLC's depth overcounts with ReadAtDecision steps; one worker).
Progressed ==
    l' > TLCGet(1) => PrintT(<<"consumed", l' - 1>>) /\ TLCSet(1, l')

\* Read-ahead: the implementation records answers for entries above next
\* and decides in entry order (RecoveryDecide).  The spec's RecoveryRead
\* reads next when it decides: before a RecoveryDecide event, TLC may take
\* client c's reads of next (the bookie side of each already happened, at
\* its BookieRead event, so the read finds the bookie's term raised and
\* changes nothing there) without consuming an event.
ReadAtDecision ==
    LET e == Trace[l] IN
    /\ e.a = "RecoveryDecide"
    /\ cl[e.c].phase = "reading"
    /\ cl[e.c].next <= e.n
    /\ \E b \in e.ans : RecoveryReadH(e.c, b, TRUE) /\ bk' = bk   \* (ans: the answers c recorded)
    /\ UNCHANGED <<l, msgs, hist, prep>>

TraceNext ==
    \/ /\ l <= Len(Trace)
       /\ Step(Trace[l])
       /\ Trace[l].a # "ClientSendAdd" => UNCHANGED msgs
       /\ l' = l + 1
       /\ prep' = IF Trace[l].a = "BookiePrepare" /\ Trace[l].ok
                  THEN [prep EXCEPT ![Trace[l].b] = <<Trace[l].n, Trace[l].t>>] ELSE prep
       /\ HistNext
       /\ Progressed
    \/ l <= Len(Trace) /\ ReadAtDecision

TraceSpec == TraceInit /\ [][TraceNext]_tvars

\* Violated (by TLC) exactly when the whole trace has been consumed: the
\* trace is a behaviour of the spec.
Unconsumed == l <= Len(Trace)
=============================================================================
