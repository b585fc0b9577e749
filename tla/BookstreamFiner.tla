--------------------------- MODULE BookstreamFiner ----------------------------
(***************************************************************************)
(* The protocol spec with the steps BookstreamLedger abstracts, so that    *)
(* TLC model-checks them (issue 14 item 3), and trace validation           *)
(* (BookstreamTrace) uses the same steps:                                  *)
(*                                                                         *)
(*   a message channel for adds: a request leaves its client with the     *)
(*     client's value, term, truncate flag and LAC/LAFR of that moment     *)
(*     (SendAdd) and may reach the bookie after the client withdrew, moved *)
(*     to another term, released the entry or dropped the bookie           *)
(*     (StaleStore: the bookie side only, nobody counts the answer);       *)
(*   stale reads: a fencing or recovery read of a term some client took    *)
(*     over with reaches a bookie late (StaleRead: raises its term);       *)
(*   explicit LAC writes (StoreLac: a bookie's LAC/LAFR rise to what a     *)
(*     writer had, possibly after the writer is gone);                     *)
(*   client give-ups (Withdraw: aborted recovery, client crash);           *)
(*   bookie restarts (Restart: a crashed bookie answers again, with what   *)
(*     it had: it fsyncs before acking and before answering a read);       *)
(*   several bookies replaced at once (EnsembleChangeSet: a writer's       *)
(*     change or a recovery's replacement, each joining bookie prepared).  *)
(*                                                                         *)
(* Every BookstreamLedger step is a step here (msgs and hist aside), so    *)
(* every invariant and property of the protocol spec is checked on the     *)
(* finer behaviours too.                                                   *)
(***************************************************************************)
EXTENDS BookstreamLedger

VARIABLES
    msgs,   \* adds sent and not yet delivered: the channel to the bookies
    hist    \* history: the highest LAC and LAFR any writer ever had

fvars == <<vars, msgs, hist>>

\* hist after a step (a writer's LAC/LAFR after it).
HistNext ==
    hist' = [lac  |-> MaxOf({hist.lac} \cup {cl'[c].lac : c \in {d \in Clients : cl'[d].phase = "open"}}),
             lafr |-> MaxOf({hist.lafr} \cup {cl'[c].lafr : c \in {d \in Clients : cl'[d].phase = "open"}})]

\* An add request: client, bookie, entry, value, term, truncate flag, the
\* LAC/LAFR it carries, and whether it is a recovery add (rec: sent by a
\* recovering client; a fenced classic bookie takes only those).
Request(c, b, n, rl, rf) ==
    [c |-> c, b |-> b, n |-> n, v |-> cl[c].val[n], t |-> cl[c].term,
     trunc |-> TruncateFlag(cl[c], n), rl |-> rl, rf |-> rf, rec |-> cl[c].phase # "open"]

\* Is request m still live at its client (a Deliver of it can be counted)?
Live(m) ==
    LET w == cl[m.c] IN
    /\ w.phase \in {"open", "reading", "finishing"} /\ w.term = m.t
    /\ w.val[m.n] = m.v /\ m.b \notin w.ack[m.n] /\ m.b \in Targets(w, m.n)

\* The requests of c to b for entry n, of c's present term, still in the
\* channel: at most one (one ordered stream per bookie; a client resends
\* only what it never had an answer for, on a new stream).
Outstanding(c, b, n) ==
    {m \in msgs : m.c = c /\ m.b = b /\ m.n = n /\ m.t = cl[c].term}

\* The client side of Deliver: the request leaves c for b and stays in the
\* channel (delayed).
SendAddWith(c, b, n, rl, rf) ==
    LET w == cl[c] IN
    /\ w.phase \in {"open", "reading", "finishing"}
    /\ w.val[n] # NoVal
    /\ b \in Targets(w, n)
    /\ b \notin w.ack[n]
    /\ Outstanding(c, b, n) = {}
    /\ rl <= w.lac /\ rf <= w.lafr
    /\ msgs' = msgs \cup {Request(c, b, n, rl, rf)}
    /\ UNCHANGED vars

\* Model checking sends the freshest LAC/LAFR (as Deliver does).
SendAdd(c, b, n) == SendAddWith(c, b, n, cl[c].lac, cl[c].lafr)

\* A delayed request reaches its bookie.  Still live at its client: it is
\* Deliver, with what the request carried.  No longer live (the client
\* withdrew, moved to another term, released the entry or dropped the
\* bookie): the bookie side of Deliver only, nobody counts the answer.
LiveStore(m, seen) ==
    /\ m \in msgs
    /\ Live(m)
    /\ DeliverWith(m.c, m.b, m.n, seen, m.rl, m.rf)
    /\ msgs' = msgs \ {m}

\* The bookie side of a request delivered late (trace validation uses it too).
\* Admitted as Deliver admits (AddAccepted): unbounded, a term not below the
\* bookie's; classic, a recovery add or an unfenced bookie (tlcbeh11: was
\* TRUE, so a fenced classic bookie stored a late normal add, which the
\* protocol refuses and sim/spec.py's BookieAdmit/BookieStore refuse).
StoreLate(m) ==
    /\ m.b \notin crashed
    /\ IF Unbounded THEN bk[m.b].term <= m.t ELSE m.rec \/ ~bk[m.b].fenced
    /\ bk' = [bk EXCEPT ![m.b].term = IF Unbounded THEN m.t ELSE @,
                        ![m.b].ents = Store(@, m.n, m.v, m.trunc),
                        ![m.b].lac  = Max2(@, m.rl),
                        ![m.b].lafr = Max2(@, m.rf)]
    /\ UNCHANGED <<crashed, meta, cl, acked>>

StaleStore(m) ==
    /\ m \in msgs
    /\ ~Live(m)
    /\ StoreLate(m)
    /\ msgs' = msgs \ {m}

\* A request whose bookie refused it, or that was lost: it leaves the channel.
DropRequest(m) ==
    /\ m \in msgs
    /\ msgs' = msgs \ {m}
    /\ UNCHANGED vars

\* A fencing or recovery read of term t (some client took the ledger over
\* with it: t <= the metadata's term) reaches bookie b after that client
\* withdrew or moved on: the bookie side only.  Classic (session 10): a
\* recovery's fencing read (the ledger is, or was, IN_RECOVERY) that
\* reaches b after its client had coverage and read on: b is fenced (a
\* real classic trace did this, and the trace spec had no step for it).
StaleRead(b, t) ==
    /\ b \notin crashed
    /\ IF Unbounded
       THEN /\ t <= meta.term
            /\ bk[b].term < t
            /\ bk' = [bk EXCEPT ![b].term = t]
       ELSE /\ meta.state # "OPEN"
            /\ ~bk[b].fenced
            /\ bk' = [bk EXCEPT ![b].fenced = TRUE]
    /\ UNCHANGED <<crashed, meta, cl, acked>>

\* An explicit LAC write: b's LAC/LAFR rise to values a writer had.
StoreLac(b, lac, lafr) ==
    /\ b \notin crashed
    /\ lac <= hist.lac
    /\ lafr <= hist.lafr
    /\ bk' = [bk EXCEPT ![b].lac = Max2(@, lac), ![b].lafr = Max2(@, lafr)]
    /\ UNCHANGED <<crashed, meta, cl, acked>>

\* A client gives up (an aborted recovery, a client crash): it only stops.
Withdraw(c) ==
    /\ cl[c].phase # "idle"
    /\ cl' = [cl EXCEPT ![c] = IdleClient]
    /\ UNCHANGED <<bk, crashed, meta, acked>>

\* A crashed bookie answers again, with what it had.
Restart(b) ==
    /\ b \in crashed
    /\ crashed' = crashed \ {b}
    /\ UNCHANGED <<bk, meta, cl, acked>>

\* A roll by size (stream/writer_core.py, ChangeReason.ROLL): once every
\* entry the writer sent is fully replicated (LAFR + 1 is the next id to
\* send: nothing of it or above went out), the writer opens a new fragment
\* there on any E bookies that are up (ens2: an ensemble as the state keeps
\* it, Canon), prepares the joining ones as
\* an ensemble change does, and CASes the fragment in; later adds go to the
\* new ensemble.  Bounded by MaxFragments (1 in the other configurations:
\* no roll there).  Mutant roll_early: the roll starts at LAC + 1, leaving
\* entries of the old fragment below Qw.
RollFragment(c, ens2) ==
    LET w     == cl[c]
        last  == LastFrag(w.frags)
        first == IF Mutant = "roll_early" THEN w.lac + 1 ELSE w.lafr + 1
        frag2 == [first |-> first, ens |-> ens2]
        join  == Members(ens2) \ Members(last.ens)
    IN
    /\ Unbounded
    /\ w.phase = "open"
    /\ first > last.first
    /\ \A i \in Ids : i >= first => w.ack[i] = {}
    /\ Len(w.frags) < MaxFragments
    /\ ens2 \in EnsemblesOf(Bookies \ crashed)
    /\ \A nb \in join : bk[nb].term <= w.term
    /\ meta.state = "OPEN" /\ meta.term = w.term
    /\ bk' = [b \in Bookies |->
                IF b \in join
                THEN [bk[b] EXCEPT !.term = w.term,
                                   !.ents = [i \in Ids |-> IF i >= first THEN NoVal ELSE bk[b].ents[i]]]
                ELSE bk[b]]
    /\ meta' = [meta EXCEPT !.frags = Append(meta.frags, frag2)]
    /\ cl' = [cl EXCEPT ![c].frags = Append(w.frags, frag2)]
    /\ UNCHANGED <<crashed, acked>>

\* BookstreamLedger's ClientStep, except that a client delivers directly
\* (send and store in one step) only what it has no request in the channel for.
FinerClientStep(c) ==
    \/ WriterAdd(c)
    \/ WriterClose(c)
    \/ StartTakeover(c)
    \/ StartReading(c)
    \/ Finish(c)
    \/ NoticeTakeover(c)
    \/ \E b \in Bookies :
         \/ \E heard \in Heard : FenceReadH(c, b, heard)
         \/ \E heard \in Heard : RecoveryReadH(c, b, heard)
         \/ Rejected(c, b)
         \/ \E n \in Ids, seen \in BOOLEAN : Outstanding(c, b, n) = {} /\ Deliver(c, b, n, seen)
    \/ \E out, ins \in SUBSET Bookies : EnsembleChangeSet(c, out, ins)   \* one or several
    \/ \E ens2 \in EnsemblesOf(Bookies) : RollFragment(c, ens2)

FinerNext ==
    \/ /\ \/ \E c \in Clients : FinerClientStep(c)
          \/ \E b \in Bookies : Crash(b)
       /\ UNCHANGED msgs
       /\ HistNext
    \/ /\ \E m \in msgs, seen \in BOOLEAN : LiveStore(m, seen)
       /\ HistNext
    \/ /\ \/ \E c \in Clients, b \in Bookies, n \in Ids : SendAdd(c, b, n)
          \/ \E m \in msgs : StaleStore(m) \/ DropRequest(m)
       /\ UNCHANGED hist
    \/ /\ \/ \E b \in Bookies, t \in 1 .. MaxTerm : StaleRead(b, t)
          \/ \E b \in Bookies : StoreLac(b, hist.lac, hist.lafr)
          \/ \E c \in Clients : Withdraw(c)
          \/ \E b \in Bookies : Restart(b)
       /\ UNCHANGED <<msgs, hist>>

FinerInit == Init /\ msgs = {} /\ hist = [lac |-> -1, lafr |-> -1]

FinerSpec == FinerInit /\ [][FinerNext]_fvars

\* The protocol spec's steps with the generalised ensemble change (several
\* bookies at once) and no channel: the configuration finer_multi, small
\* enough to exhaust (the channel's steps are FinerNext's, in finer).
MultiNext ==
    /\ \/ \E c \in Clients : \/ ClientStep(c)
                             \/ \E out, ins \in SUBSET Bookies : EnsembleChangeSet(c, out, ins)
       \/ \E b \in Bookies : Crash(b)
       \/ Terminate
    /\ UNCHANGED <<msgs, hist>>

MultiSpec == FinerInit /\ [][MultiNext]_fvars

\* Bound the channel for model checking (state constraints: they prune
\* behaviours, add none): at most 2 (1) requests delayed at once.
ChannelBound == Cardinality(msgs) <= 2
ChannelOne == Cardinality(msgs) <= 1
ChannelNone == msgs = {}
\* Only changes that replace the whole first ensemble (E = 2: both bookies at
\* once; one at a time is the other configurations'): every fragment, the
\* metadata's and the clients', is Ensemble0 or disjoint from it.
WholeChangesOnly ==
    \A fs \in {meta.frags} \cup {cl[c].frags : c \in Clients} :
        \A i \in DOMAIN fs : Members(fs[i].ens) = Ensemble0 \/ Members(fs[i].ens) \cap Ensemble0 = {}
=============================================================================
