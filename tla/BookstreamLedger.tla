--------------------------- MODULE BookstreamLedger ---------------------------
(***************************************************************************)
(* One bookstream ledger, replicated on bookies with the BookKeeper        *)
(* protocol.  Two modes share this module:                                 *)
(*                                                                         *)
(*   Mode = "unbounded"  the term-based, unbounded ledger: any client may  *)
(*                       take the ledger over by raising its term in the   *)
(*                       metadata; recovery runs at the start of every     *)
(*                       term and ends with a truncate no-op that reaches  *)
(*                       every bookie of the last fragment; the ledger is  *)
(*                       then OPEN again, for the new term.                *)
(*   Mode = "classic"    the bounded ledger: a boolean fence instead of    *)
(*                       terms; recovery (or the writer) closes the ledger *)
(*                       once, with its last entry, by CAS.                *)
(*                                                                         *)
(* Granularity.  A request and the bookie's handling of it are one step,   *)
(* and so is the handling of its answer, except that the answer to an add  *)
(* may be lost (Deliver with seen = FALSE): the bookie stored the entry,   *)
(* the writer never hears of it.  A client can always wait, so a delayed   *)
(* request or answer is the same as one delivered later.  A metadata CAS   *)
(* that succeeds is one step; a CAS that would fail is modelled by the     *)
(* client re-reading the metadata (NoticeTakeover).                        *)
(*                                                                         *)
(* Striping (E > Qw): entry n's write set is the WQ bookies of its        *)
(* fragment's ordered ensemble from position n mod E (BookstreamBase);     *)
(* acks, recovery reads and their "absent" decision, and the invariants    *)
(* are per entry's write set; fencing needs coverage of every write set;   *)
(* the truncate no-op goes to every bookie of the last ensemble.           *)
(*                                                                         *)
(* Mutant selects one broken rule (see README.md); "none" is the real      *)
(* protocol.                                                               *)
(***************************************************************************)
EXTENDS BookstreamBase   \* constants, ids and values, write sets, quorum math, state, bookie rules

(***************************************************************************)
(* Initial state: the Creator made the ledger (term 1, OPEN) on the        *)
(* bookies Ensemble0; no bookie has heard of it yet.                       *)
(***************************************************************************)
Init ==
    LET frags == << [first |-> 0, ens |-> Canon(Ensemble0Order)] >>
    IN
    /\ bk = [b \in Bookies |-> [term   |-> 0,
                                fenced |-> FALSE,
                                ents   |-> [i \in Ids |-> NoVal],
                                lac    |-> -1,
                                lafr   |-> -1]]
    /\ crashed = {}
    /\ meta = [state |-> "OPEN", term |-> 1, frags |-> frags, last |-> -1]
    /\ cl = [c \in Clients |->
                IF c = Creator
                THEN [IdleClient EXCEPT !.phase = "open", !.term = 1, !.frags = frags]
                ELSE IdleClient]
    /\ acked = {}

(***************************************************************************)
(* The writer adds the next entry (a pending add).                         *)
(***************************************************************************)
WriterAdd(c) ==
    LET w == cl[c]
        n == w.lap + 1
    IN
    /\ w.phase = "open"
    /\ n <= MaxDataId
    /\ w.lap - Released(w) < InflightLimit
    /\ cl' = [cl EXCEPT ![c].val[n] = Data(w.term), ![c].lap = n]
    /\ UNCHANGED <<bk, crashed, meta, acked>>

(***************************************************************************)
(* An ack reaches client c from bookie b for entry n.  An "open" writer    *)
(* moves its LAC and LAFR up, acknowledges the entries its LAC passed to   *)
(* the application, and releases what it no longer needs to resend.  A    *)
(* recovering client only counts the ack (its LAC/LAFR stay frozen).       *)
(***************************************************************************)
AckFrom(c, b, n) ==
    LET w == cl[c]
        ack2 == [w.ack EXCEPT ![n] = @ \cup {b}]
    IN
    IF w.phase = "open"
    THEN LET lac2  == Advance(w.lac, ack2, AQ)
             lafr2 == IF Unbounded THEN Advance(w.lafr, ack2, WQ) ELSE -1
             rel   == IF Unbounded /\ Mutant # "release_at_qa" THEN lafr2 ELSE lac2
         IN
         /\ cl' = [cl EXCEPT
                     ![c].ack  = [i \in Ids |-> IF i <= rel THEN {} ELSE ack2[i]],
                     ![c].val  = [i \in Ids |-> IF i <= rel THEN NoVal ELSE w.val[i]],
                     ![c].lac  = lac2,
                     ![c].lafr = lafr2]
         /\ acked' = acked \cup {<<i, w.val[i]>> : i \in (w.lac + 1) .. lac2}
    ELSE /\ cl' = [cl EXCEPT ![c].ack = ack2]
         /\ UNCHANGED acked

(***************************************************************************)
(* Bookie b receives client c's add of entry n (a normal add, a recovery   *)
(* write-back, or the truncate no-op) and stores it; its ack reaches the   *)
(* client (seen) or is lost.                                               *)
(***************************************************************************)
\* The request carries the LAC and LAFR the client had when it sent it (rl,
\* rf: at most the client's present ones).  Next sends the freshest (an
\* older LAC on a bookie is weaker); trace validation uses the record's own.
DeliverWith(c, b, n, seen, rl, rf) ==
    LET w == cl[c]
        v == w.val[n]
    IN
    /\ w.phase \in {"open", "reading", "finishing"}
    /\ v # NoVal
    /\ b \in Targets(w, n) \ crashed
    /\ b \notin w.ack[n]
    /\ AddAccepted(w, b)
    /\ rl <= w.lac /\ rf <= w.lafr
    /\ seen \/ (LostAcks /\ bk[b].ents[n] # v)   \* (losing the ack of a copy it holds: a stutter)
    /\ bk' = [bk EXCEPT
                ![b].term = IF Unbounded THEN w.term ELSE @,
                ![b].ents = Store(@, n, v, TruncateFlag(w, n)),
                ![b].lac  = Max2(@, rl),
                ![b].lafr = Max2(@, rf)]
    /\ IF seen THEN AckFrom(c, b, n) ELSE UNCHANGED <<cl, acked>>
    /\ UNCHANGED <<crashed, meta>>

Deliver(c, b, n, seen) == DeliverWith(c, b, n, seen, cl[c].lac, cl[c].lafr)

(***************************************************************************)
(* A bookie refuses client c (InvalidTerm; classic: a fenced ledger        *)
(* refuses a normal add).  The client withdraws.                           *)
(***************************************************************************)
Rejected(c, b) ==
    LET w == cl[c] IN
    /\ w.phase # "idle"
    /\ b \in (Members(LastFrag(w.frags).ens) \cup Members(w.rens)) \ crashed
    /\ IF Unbounded THEN bk[b].term > w.term
                    ELSE w.phase = "open" /\ bk[b].fenced
    /\ cl' = [cl EXCEPT ![c] = IdleClient]
    /\ UNCHANGED <<bk, crashed, meta, acked>>

(***************************************************************************)
(* Client c re-reads the metadata (a CAS of its failed, or a watch fired)  *)
(* and sees that another client took the ledger over: it withdraws.        *)
(***************************************************************************)
NoticeTakeover(c) ==
    LET w == cl[c] IN
    /\ IF Unbounded THEN w.phase # "idle" /\ meta.term > w.term
                    ELSE w.phase = "open" /\ meta.state # "OPEN"
    /\ cl' = [cl EXCEPT ![c] = IdleClient]
    /\ UNCHANGED <<bk, crashed, meta, acked>>

(***************************************************************************)
(* Recovery step 1: take-over.  Unbounded: CAS term + 1 and IN_RECOVERY.   *)
(* Classic: CAS IN_RECOVERY (several readers may recover at once).         *)
(***************************************************************************)
StartTakeover(c) ==
    LET t == IF Unbounded THEN meta.term + 1 ELSE meta.term IN
    /\ cl[c].phase = "idle"
    /\ meta.state # "CLOSED"
    /\ t <= MaxTerm
    /\ meta' = [meta EXCEPT !.state = "IN_RECOVERY", !.term = t]
    /\ cl' = [cl EXCEPT ![c] = [IdleClient EXCEPT !.phase = "fencing",
                                                  !.term  = t,
                                                  !.frags = meta.frags,
                                                  !.rens  = LastFrag(meta.frags).ens]]
    /\ UNCHANGED <<bk, crashed, acked>>

(***************************************************************************)
(* Recovery step 2: a fencing LAC/LAFR read to a bookie of the last        *)
(* fragment (all E); it carries the term (classic: the fence flag).        *)
(***************************************************************************)
\* heard: the answer reaches the client (else it is lost or comes too late:
\* the bookie's side happened, the client's did not).
FenceReadH(c, b, heard) ==
    LET w == cl[c] IN
    /\ w.phase = "fencing"
    /\ b \in Members(w.rens) \ (crashed \cup w.fenced)
    /\ ReadAccepted(w, b, "fence")
    /\ bk' = [bk EXCEPT ![b] = AfterRead(@, w, "fence")]
    /\ IF heard
       THEN cl' = [cl EXCEPT ![c].fenced = @ \cup {b},
                             ![c].lac    = Max2(@, bk[b].lac),
                             ![c].lafr   = Max2(@, bk[b].lafr)]
       ELSE /\ bk' # bk   \* (an unheard read that changes nothing: a stutter)
            /\ UNCHANGED cl
    /\ UNCHANGED <<crashed, meta, acked>>

FenceRead(c, b) == FenceReadH(c, b, TRUE)

\* Read answers may be lost where adds' acks may (LostAcks).
Heard == IF LostAcks THEN BOOLEAN ELSE {TRUE}

(***************************************************************************)
(* Recovery step 3: coverage reached (Covered: in every write set of the   *)
(* last ensemble, Coverage bookies answered); read forward from LAFR + 1   *)
(* (classic: LAC + 1), never below the first entry of the last fragment.   *)
(***************************************************************************)
StartReading(c) ==
    LET w == cl[c]
        from == IF Unbounded THEN w.lafr + 1 ELSE w.lac + 1
    IN
    /\ w.phase = "fencing"
    /\ Covered(w.fenced, w.rens)
    /\ cl' = [cl EXCEPT ![c].phase  = "reading",
                        ![c].fenced = {},
                        ![c].next   = Max2(from, LastFrag(w.frags).first)]
    /\ UNCHANGED <<bk, crashed, meta, acked>>

(***************************************************************************)
(* Recovery step 4: a recovery read of entry next from a bookie of its     *)
(* write set in the last fragment (it carries the term).  One OK whose     *)
(* origin term is not below the floor: recoverable, written back (step 5)  *)
(* and the read moves on; an OK below the floor is stale and counts as     *)
(* NoSuchEntry.  Coverage NoSuchEntry (of next's write set): absent, the   *)
(* end:                                                                    *)
(* unbounded writes the truncate no-op there (step 6); classic will close  *)
(* with last entry = next - 1.                                             *)
(***************************************************************************)
\* The origin term of a stored value: the term of the writer that created it
\* (a recovery's no-op: the recovering term).  A write-back copies the value,
\* so it keeps its origin term whatever the request's term.
Origin(v) == v[1]

\* Does a recovery take an OK answer holding v?  Only if v's origin term is
\* not below the floor: the highest origin term of the entries the recovery
\* has decided so far.  An older term's entry above a newer term's entry is
\* stale (Raft's log matching): it counts as NoSuchEntry.  The mutant
\* no_origin_floor is the rule before the fix: any OK answer is taken.
Fresh(w, v) == Mutant = "no_origin_floor" \/ Origin(v) >= w.floor

\* Where a recovery read of entry n goes: n's write set in the read ensemble
\* (the mutant absent_over_ensemble: any bookie of it, each NoSuchEntry
\* counted towards "absent").
ReadSet(w, n) ==
    IF Mutant = "absent_over_ensemble" THEN Members(w.rens) ELSE WriteSetOf(n, w.rens)

RecoveryReadH(c, b, heard) ==
    LET w == cl[c]
        n == w.next
        v == bk[b].ents[n]
    IN
    /\ w.phase = "reading"
    /\ Assert(n <= IdMax, "recovery read beyond the modelled ids")
    /\ b \in ReadSet(w, n) \ (crashed \cup w.nosuch)
    /\ ReadAccepted(w, b, "entry")
    /\ bk' = [bk EXCEPT ![b] = AfterRead(@, w, "entry")]
    /\ IF ~heard THEN bk' # bk /\ UNCHANGED cl
       ELSE IF v # NoVal /\ Fresh(w, v)
       THEN cl' = [cl EXCEPT ![c].val[n] = v, ![c].next = n + 1, ![c].nosuch = {},
                             ![c].floor = Max2(@, Origin(v))]
       ELSE IF Cardinality(w.nosuch) + 1 >= Coverage
            THEN cl' = [cl EXCEPT ![c].phase  = "finishing",
                                  ![c].nosuch = {},
                                  ![c].val[n] = IF Unbounded THEN NoOp(w.term) ELSE @]
            ELSE cl' = [cl EXCEPT ![c].nosuch = @ \cup {b}]
    /\ UNCHANGED <<crashed, meta, acked>>

RecoveryRead(c, b) == RecoveryReadH(c, b, TRUE)

(***************************************************************************)
(* Recovery step 8: every recovery write reached Qw, the no-op every      *)
(* bookie it goes to (the mutant truncate_no_gwq accepts Qa for the        *)
(* no-op): CAS the metadata.                                               *)
(* Unbounded: OPEN for the client's term, publishing any ensemble change   *)
(* it made; the client is the writer, its LAC and LAFR at the no-op.       *)
(* Classic: CLOSED with the last entry (or already CLOSED by another).     *)
(***************************************************************************)
NeededAcks(w, i) ==
    IF NoOpEnd(w, i)
    THEN IF Mutant = "truncate_no_gwq" THEN AQ ELSE Cardinality(Targets(w, i))
    ELSE WQ

\* Every recovery write reached its quorum: the recovery's LAFR, scanned up
\* from the frozen LAFR, reaches the end.  The mutant lafr_from_lac has the
\* notes' pitfall: it scans from the frozen LAC + 1, so a write-back at or
\* below the LAC that is still at Qa only is passed over.
RecoveryWritesDone(w) ==
    \A i \in Ids :
        /\ w.val[i] # NoVal
        /\ Mutant # "lafr_from_lac" \/ i > w.lac
        => Cardinality(w.ack[i]) >= NeededAcks(w, i)

Finish(c) ==
    LET w == cl[c] IN
    /\ w.phase = "finishing"
    /\ RecoveryWritesDone(w)
    /\ IF Unbounded
       THEN /\ meta.term = w.term
            /\ meta.state = "IN_RECOVERY"
            /\ meta' = [meta EXCEPT !.state = "OPEN", !.frags = w.frags]
            /\ cl' = [cl EXCEPT ![c] = [IdleClient EXCEPT !.phase = "open",
                                                          !.term  = w.term,
                                                          !.frags = w.frags,
                                                          !.lac   = w.next,
                                                          !.lafr  = w.next,
                                                          !.lap   = w.next]]
       ELSE /\ meta.state \in {"IN_RECOVERY", "CLOSED"}
            /\ meta' = IF meta.state = "IN_RECOVERY"
                       THEN [meta EXCEPT !.state = "CLOSED", !.last = w.next - 1,
                                         !.frags = w.frags]
                       ELSE meta
            /\ cl' = [cl EXCEPT ![c] = IdleClient]
    /\ UNCHANGED <<bk, crashed, acked>>

(***************************************************************************)
(* Classic: the writer closes, with no pending adds, by CAS OPEN ->        *)
(* CLOSED with its LAC as last entry.                                      *)
(***************************************************************************)
WriterClose(c) ==
    LET w == cl[c] IN
    /\ ~Unbounded
    /\ w.phase = "open"
    /\ w.lap = w.lac
    /\ meta.state = "OPEN"
    /\ meta' = [meta EXCEPT !.state = "CLOSED", !.last = w.lac]
    /\ cl' = [cl EXCEPT ![c] = IdleClient]
    /\ UNCHANGED <<bk, crashed, acked>>

(***************************************************************************)
(* Ensemble change: bookie b of the last fragment failed: it crashed, or   *)
(* an add to it is outstanding and timed out (possibly after b stored it:  *)
(* a lost ack; the pending adds are all at or above the new fragment's     *)
(* first entry, so dropping b's acks for them below is exactly what a lost *)
(* ack would leave).  Classic: the add to b may be one the writer already  *)
(* released at Qa (an add of the last fragment, up to lap): its late       *)
(* timeout or error still fails b (the implementation's frame timeout;     *)
(* BookKeeper's error after the ack quorum).  Unbounded releases at Qw,    *)
(* after b's ack.  nb replaces it in a fragment that starts at LAFR + 1    *)
(* (classic: LAC + 1), never below the last fragment's first entry; if it  *)
(* starts there, it replaces the last fragment.                            *)
(*                                                                         *)
(* The writer publishes the change by CAS at once.  Rule 3 (unbounded): it *)
(* does not replace b while b acked a committed entry (LAFR+1..LAC) that   *)
(* is still below Qw.  A recovering client (reading or finishing) keeps    *)
(* the change local and publishes it with its final CAS; its reads stay on *)
(* the ensemble they started with (rens), and it never picks one of those  *)
(* bookies as a replacement.                                               *)
(*                                                                         *)
(* Unbounded: nb is prepared first, by a request carrying the client's     *)
(* term: its term is raised and whatever it holds from the new fragment's  *)
(* first entry up is deleted.  A bookie that left the ensemble earlier may *)
(* hold entries of an older term there (README: ensemble_no_prepare).      *)
(* The deletion is safe because nb is in no published write set at or      *)
(* above that entry: not in the last ensemble, nor (recovery) in rens.     *)
(* EnsembleChangeMap replaces each failed bookie b of DOMAIN rep by       *)
(* rep[b], in b's position (striping: rep[b] takes over b's write sets),   *)
(* each prepared, rule 3 for each replaced bookie; EnsembleChangeSet(c,    *)
(* out, ins) is such a change for some pairing of out with ins.  This spec *)
(* replaces one at a time, BookstreamFiner several at once (mutant         *)
(* multi_no_rule3).                                                        *)
(***************************************************************************)
EnsembleChangeMap(c, rep) ==
    LET w     == cl[c]
        out   == DOMAIN rep
        ins   == Range(rep)
        last  == LastFrag(w.frags)
        first == Max2(IF Unbounded THEN w.lafr + 1 ELSE w.lac + 1, last.first)
        ens2  == Replace(last.ens, rep)
        frag2 == [first |-> first, ens |-> ens2]
        frags2 == IF first = last.first
                  THEN [w.frags EXCEPT ![Len(w.frags)] = frag2]
                  ELSE Append(w.frags, frag2)
        prepare == Unbounded /\ Mutant # "ensemble_no_prepare"
        rule3 == IF Mutant = "multi_no_rule3" /\ Cardinality(out) > 1 THEN {} ELSE out
    IN
    /\ w.phase \in {"open", "reading", "finishing"}
    /\ out # {} /\ out \subseteq Members(last.ens) /\ Cardinality(ins) = Cardinality(out)
    /\ ins \cap (Members(last.ens) \cup Members(w.rens) \cup crashed) = {}
    /\ Len(frags2) <= MaxFragments
    /\ \A b \in out :
       \/ b \in crashed
       \/ \E i \in Ids : w.val[i] # NoVal /\ b \in Targets(w, i)
       \/ /\ ~Unbounded /\ w.phase = "open"
          /\ \E i \in last.first .. w.lap : b \in WriteSet(i, w.frags)
    /\ w.phase = "open" /\ Unbounded =>
           \A b \in rule3 : \A i \in (w.lafr + 1) .. w.lac : b \in w.ack[i] => Cardinality(w.ack[i]) >= WQ
    /\ ~prepare \/ \A nb \in ins : bk[nb].term <= w.term
    /\ bk' = IF prepare
             THEN [b \in Bookies |->
                     IF b \in ins
                     THEN [bk[b] EXCEPT !.term = w.term,
                                        !.ents = [i \in Ids |-> IF i >= first THEN NoVal ELSE bk[b].ents[i]]]
                     ELSE bk[b]]
             ELSE bk
    /\ IF w.phase = "open"
       THEN /\ meta.state = "OPEN"
            /\ meta.term = w.term
            /\ meta' = [meta EXCEPT !.frags = frags2]
       ELSE UNCHANGED meta
    /\ cl' = [cl EXCEPT ![c].frags = frags2,
                        ![c].ack   = [i \in Ids |-> IF i >= first THEN w.ack[i] \ out
                                                    ELSE w.ack[i]]]
    /\ UNCHANGED <<crashed, acked>>

\* (BookstreamFiner: several at once)
EnsembleChangeSet(c, out, ins) == \E rep \in [out -> ins] : Range(rep) = ins /\ EnsembleChangeMap(c, rep)

EnsembleChange(c, b, nb) == EnsembleChangeMap(c, b :> nb)

(***************************************************************************)
(* A bookie crashes: it stops answering.  It fsyncs before acking, so it   *)
(* loses nothing; it does not come back in this model.                     *)
(***************************************************************************)
Crash(b) ==
    /\ b \notin crashed
    /\ Cardinality(crashed) < MaxCrashes
    /\ crashed' = crashed \cup {b}
    /\ UNCHANGED <<bk, meta, cl, acked>>

(***************************************************************************)
(* Terminal states: the ledger is OPEN (unbounded) or CLOSED (classic),    *)
(* no take-over can start any more, and every client is idle or the        *)
(* current writer with nothing pending and no id left to add.  Terminate   *)
(* lets TLC's deadlock check tell those apart from a stuck protocol.       *)
(***************************************************************************)
Quiescent ==
    IF Unbounded
    THEN /\ meta.state = "OPEN"
         /\ meta.term = MaxTerm
         /\ \A c \in Clients :
               \/ cl[c].phase = "idle"
               \/ /\ cl[c].phase = "open"
                  /\ cl[c].term = meta.term
                  /\ cl[c].lap >= MaxDataId
                  /\ \A i \in Ids : cl[c].val[i] = NoVal
    ELSE /\ meta.state = "CLOSED"
         /\ \A c \in Clients : cl[c].phase = "idle"

Terminate == Quiescent /\ UNCHANGED vars

ClientStep(c) ==
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
         \/ \E n \in Ids, seen \in BOOLEAN : Deliver(c, b, n, seen)
         \/ \E nb \in Bookies : EnsembleChange(c, b, nb)

Next ==
    \/ \E c \in Clients : ClientStep(c)
    \/ \E b \in Bookies : Crash(b)
    \/ Terminate

Spec == Init /\ [][Next]_vars

(***************************************************************************)
(* Liveness: with no crashes, and every client's recovery and delivery     *)
(* steps weakly fair, every recovery ends (the client writes, or withdrew  *)
(* because another took over) and the ledger ends up OPEN (CLOSED) for     *)
(* good.  Writers' adds and take-overs need no fairness.                   *)
(***************************************************************************)
Progress(c) ==
    \/ StartReading(c)
    \/ Finish(c)
    \/ NoticeTakeover(c)
    \/ \E b \in Bookies :
         \/ FenceRead(c, b)
         \/ RecoveryRead(c, b)
         \/ Rejected(c, b)
         \/ \E n \in Ids : Deliver(c, b, n, TRUE)

FairSpec == Spec /\ \A c \in Clients : WF_vars(Progress(c))

RecoveryEnds ==
    \A c \in Clients : Recovering(c) ~> cl[c].phase \in {"open", "idle"}

LedgerSettles ==
    <>[](meta.state = IF Unbounded THEN "OPEN" ELSE "CLOSED")

-----------------------------------------------------------------------------
(***************************************************************************)
(* Safety.                                                                 *)
(***************************************************************************)
Values == {NoVal} \cup {Data(t) : t \in 1 .. MaxTerm} \cup {NoOp(t) : t \in 1 .. MaxTerm}

TypeOK ==
    /\ \A b \in Bookies :
          /\ bk[b].term \in 0 .. MaxTerm
          /\ bk[b].fenced \in BOOLEAN
          /\ bk[b].ents \in [Ids -> Values]
          /\ bk[b].lac \in -1 .. IdMax
          /\ bk[b].lafr \in -1 .. IdMax
    /\ crashed \subseteq Bookies
    /\ meta.state \in {"OPEN", "IN_RECOVERY", "CLOSED"}
    /\ meta.term \in 1 .. MaxTerm
    /\ \A c \in Clients :
          /\ cl[c].phase \in {"idle", "fencing", "reading", "finishing", "open"}
          /\ cl[c].next \in 0 .. IdMax
          /\ cl[c].floor \in 0 .. MaxTerm
          /\ cl[c].val \in [Ids -> Values]
    /\ acked \subseteq (Ids \X Values)

\* The highest entry some reader may read: what a bookie reports as LAC,
\* what a writer confirmed, and a closed ledger's last entry.
CommittedBound ==
    MaxOf({bk[b].lac : b \in Bookies}
          \cup {cl[c].lac : c \in {d \in Clients : cl[d].phase = "open"}}
          \cup (IF meta.state = "CLOSED" THEN {meta.last} ELSE {}))

\* The values a reader can get for entry n from the bookies that the
\* metadata says hold it.
ReadableValues(n) ==
    {bk[b].ents[n] : b \in WriteSet(n, meta.frags)} \ {NoVal}

\* No divergence: every committed entry is readable, with one value only.
NoDivergence ==
    \A n \in Ids : n <= CommittedBound => Cardinality(ReadableValues(n)) = 1

\* Every entry acknowledged to an application is on at least Qa bookies of
\* its write set in the metadata (so it survives Qa - 1 crashes).
AckedDurable ==
    \A p \in acked :
        Cardinality({b \in WriteSet(p[1], meta.frags) : bk[b].ents[p[1]] = p[2]}) >= AQ

\* Entries up to any LAFR (a bookie's, or a writer's) are on every bookie of
\* their write set: the meaning of "fully replicated" (the LAFR pitfall).
LafrFullyReplicated ==
    /\ \A n \in Ids :
          (\E b \in Bookies : n <= bk[b].lafr) =>
              \A b \in WriteSet(n, meta.frags) : bk[b].ents[n] # NoVal
    /\ \A c \in Clients :
          cl[c].phase = "open" =>
              \A n \in 0 .. cl[c].lafr :
                  \A b \in WriteSet(n, cl[c].frags) : bk[b].ents[n] # NoVal

\* The value a reader gets for entry n (meaningful where NoDivergence holds).
ReadValue(n) == IF ReadableValues(n) = {} THEN NoVal ELSE CHOOSE v \in ReadableValues(n) : TRUE

\* No hole: what survives of one writer's term, as a reader sees it up to
\* the committed bound (an LAC, a reopened or a closed ledger), is a prefix
\* of what that writer sent, at consecutive positions.  The writer of term t
\* adds from just above its recovery's no-op (term 1: from entry 0), so an
\* entry Data(t) is preceded by Data(t) or by NoOp(t), or is entry 0 of
\* term 1.  (Issue 12 item 0: NoOp(2), Data(1), Data(1) is a hole.)
NoHole ==
    \A n \in Ids :
        /\ n <= CommittedBound
        /\ Cardinality(ReadableValues(n)) = 1
        /\ ReadValue(n)[2] = "data"
        => IF n = 0 THEN Origin(ReadValue(n)) = 1
           ELSE /\ Cardinality(ReadableValues(n - 1)) = 1
                /\ ReadValue(n - 1) \in {ReadValue(n), NoOp(Origin(ReadValue(n)))}

\* No dirty reads (after Vanlightly's specs): a reader may read up to any
\* LAC a bookie reports, so every entry up to a bookie's LAC is committed:
\* on at least Qa bookies of its write set in the metadata, with the value
\* a reader gets.  (AckedDurable covers what a writer acknowledged; this
\* covers what the bookies advertise, recovery's frozen LAC included.)
NoDirtyReads ==
    \A b \in Bookies : \A n \in 0 .. bk[b].lac :
        /\ ReadableValues(n) # {}
        /\ Cardinality({x \in WriteSet(n, meta.frags) : bk[x].ents[n] = ReadValue(n)}) >= AQ

\* Tail fragments reach the write quorum (after Vanlightly's guaranteed-write-
\* quorum spec): unbounded, a fragment that is no longer the last one was
\* sealed at the writer's (or recovery's) LAFR + 1, so each of its entries
\* is on every bookie of its write set there, with one value.  (Classic seals at
\* LAC + 1: an entry of a sealed fragment may be on Qa bookies only.)
TailFragmentsReachWriteQuorum ==
    Unbounded =>
        \A f \in 1 .. Len(meta.frags) - 1 :
            \A n \in meta.frags[f].first .. meta.frags[f + 1].first - 1 :
                /\ \A b \in WriteSetOf(n, meta.frags[f].ens) : bk[b].ents[n] # NoVal
                /\ Cardinality({bk[b].ents[n] : b \in WriteSetOf(n, meta.frags[f].ens)}) = 1

\* Classic: a closed ledger's last entry covers every acknowledged entry.
ClosedCoversAcked ==
    meta.state = "CLOSED" => \A p \in acked : p[1] <= meta.last

\* Readers agree: once committed, an entry's readable value never changes,
\* so all readers that read entry n see the same value.
ReadsStable ==
    [][(bk' # bk \/ meta'.frags # meta.frags) =>
          \A n \in Ids : n <= CommittedBound => ReadableValues(n)' = ReadableValues(n)]_vars

\* Terms (metadata and bookies), bookie LACs and LAFRs never go down.
Monotonic ==
    [][/\ meta.term' >= meta.term
       /\ \A b \in Bookies : /\ bk'[b].term >= bk[b].term
                             /\ bk'[b].lac >= bk[b].lac
                             /\ bk'[b].lafr >= bk[b].lafr]_vars

\* Bookies are interchangeable.  (Init names Ensemble0 and, striped, its
\* order Ensemble0Order, which are not symmetric, but Next and the
\* properties are, which is what TLC's reduction needs for safety checking:
\* renaming the bookies maps an ordered ensemble to another, and write sets
\* depend on positions only.)
Symmetry == Permutations(Bookies)

(***************************************************************************)
(* State constraints that configurations may use to split the model.       *)
(***************************************************************************)
\* Only the writer changes the ensemble (none during recovery).
WriterEnsembleChangesOnly ==
    \A c \in Clients :
        cl[c].phase \in {"reading", "finishing"} /\ cl[c].term = meta.term =>
            cl[c].frags = meta.frags

\* A recovery replaces only crashed bookies (no time-outs during recovery).
RecoveryReplacesCrashedOnly ==
    \A c \in Clients :
        cl[c].phase \in {"reading", "finishing"} /\ cl[c].term = meta.term =>
            Members(cl[c].rens) \ Members(LastFrag(cl[c].frags).ens) \subseteq crashed

\* Only the writer of term 1 (the Creator) adds data; later terms write
\* their no-ops and recover (the hole's schedule needs no more).
FirstTermDataOnly ==
    /\ \A c \in Clients : \A i \in Ids : cl[c].val[i] \in {NoVal, Data(1)} \cup {NoOp(t) : t \in 1 .. MaxTerm}
    /\ \A c \in Clients : cl[c].phase = "open" /\ cl[c].term > 1 => cl[c].lap = cl[c].lac

\* Only crashed bookies are replaced (by writers and recoveries alike).
CrashReplacementsOnly ==
    /\ Ensemble0 \ Members(LastFrag(meta.frags).ens) \subseteq crashed
    /\ \A c \in Clients :
          cl[c].frags # <<>> => Ensemble0 \ Members(LastFrag(cl[c].frags).ens) \subseteq crashed

\* Each bookie stores a client's adds in id order (one stream per bookie, as
\* in the implementation): among the adds a client has not released, a
\* bookie that acknowledged one acknowledged every lower one it must hold.
AddsInOrder ==
    \A c \in Clients : \A i, j \in Ids :
        i < j /\ cl[c].val[i] # NoVal /\ cl[c].val[j] # NoVal =>
            \A b \in cl[c].ack[j] \cap WriteSet(i, cl[c].frags) : b \in cl[c].ack[i]

\* A reachability witness (a configuration expects it violated): a recovery
\* that replaced a crashed bookie is about to send its truncate no-op to a
\* bookie holding an entry above it, which the no-op will delete, in a state
\* that unbounded_crash_ids2's constraints admit (TLC checks invariants on
\* states the constraints then prune).
NoDeletingTruncationAfterRecoveryChange ==
    ~ /\ CrashReplacementsOnly /\ AddsInOrder
      /\ \E c \in Clients, b \in Bookies :
           LET w == cl[c] IN
           /\ w.phase = "finishing"
           /\ crashed # {}
           /\ LastFrag(w.frags).ens # w.rens
           /\ b \in Targets(w, w.next) \ (crashed \cup w.ack[w.next])
           /\ bk[b].term <= w.term
           /\ \E i \in Ids : i > w.next /\ bk[b].ents[i] # NoVal
=============================================================================
