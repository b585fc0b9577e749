---------------------------- MODULE BookstreamBase -----------------------------
(***************************************************************************)
(* The ground the bookstream ledger spec stands on: its constants, entry   *)
(* ids and values, ensembles and write sets (E > Qw striping), quorum      *)
(* coverage, LAC/LAFR advance, the variables, the client state and the     *)
(* bookies' rules.  BookstreamLedger EXTENDS it with the actions and the   *)
(* properties (the split keeps each module under 700 lines).               *)
(*                                                                         *)
(* Striping (BookKeeper's round robin, stream/quorum.py write_set): a      *)
(* fragment's ensemble is an ORDERED list of E bookies and entry n is      *)
(* written to the WQ bookies from position n mod E, wrapping.  With E = WQ *)
(* every entry's write set is the whole ensemble and the order means       *)
(* nothing, so an ensemble is then kept as a set (Canon): the states, and  *)
(* TLC's symmetry reduction over the bookies, are those of the spec before *)
(* striping.  With E > WQ it is a sequence.  Renaming bookies maps a       *)
(* sequence of bookies to another, so Next stays symmetric either way.     *)
(***************************************************************************)
EXTENDS Integers, FiniteSets, Sequences, TLC

CONSTANTS
    Bookies,        \* the bookies, e.g. {b1, b2, b3}
    Ensemble0,      \* the ledger's first ensemble: E bookies (E >= WQ), a set
    Clients,        \* the clients that may write or take over, e.g. {c1, c2}
    Creator,        \* the client that created the ledger (the term-1 writer)
    WQ,             \* write quorum Qw (<= the ensemble size E)
    AQ,             \* ack quorum Qa
    Mode,           \* "unbounded" or "classic"
    MaxTerm,        \* unbounded: the highest term a take-over may reach
    MaxDataId,      \* the highest entry id a writer may add
    InflightLimit,  \* at most this many adds a writer has not released
    MaxCrashes,     \* at most this many bookies crash (and stop answering)
    MaxFragments,   \* at most this many fragments (bounds ensemble changes)
    LostAcks,       \* TRUE: an add's ack may be lost (stored, never counted)
    Mutant          \* "none", or the one rule this run breaks

Mutants == {"none",
            "no_truncate",            \* (1) the final no-op has no truncate flag
            "truncate_no_gwq",        \* (2) recovery ends when the no-op reached Qa only
            "recovery_reads_no_term", \* (3) fencing and recovery reads carry no term
            "entry_reads_no_term",    \* (3b) only the recovery (entry) reads carry none
            "lafr_from_lac",          \* (4) recovery's LAFR is scanned from LAC + 1
            "writeback_truncates",    \* (5) a written-back no-op keeps its truncate flag
            "ensemble_no_prepare",    \* (6) a replacement bookie is used as it is
            "no_origin_floor",        \* (7) recovery takes any OK answer (no origin-term floor)
            "release_at_qa",          \* (8) unbounded: a writer releases a pending add at Qa
            "roll_early",             \* (9) BookstreamFiner: a roll leaves entries below Qw behind
            "multi_no_rule3",         \* (10) BookstreamFiner: a change replacing several skips rule 3
            \* striping (E > WQ) only: with E = WQ each is the real rule
            "coverage_over_ensemble", \* (11) fencing coverage: WQ - AQ + 1 of the ensemble
            "absent_over_ensemble",   \* (12) recovery reads count NoSuchEntry from the whole ensemble
            "noop_to_write_set",      \* (13) the truncate no-op goes to its write set only
            "replacement_appended"}   \* (14) a replacement goes to the end, not to b's position

ASSUME Mode \in {"unbounded", "classic"}
ASSUME Mutant \in Mutants
ASSUME Creator \in Clients
ASSUME Ensemble0 \subseteq Bookies /\ WQ <= Cardinality(Ensemble0)
ASSUME WQ \in Nat /\ AQ \in Nat /\ 1 <= AQ /\ AQ <= WQ /\ WQ <= Cardinality(Bookies)
ASSUME MaxTerm \in Nat /\ MaxTerm >= 1
ASSUME MaxDataId \in Nat /\ InflightLimit \in Nat /\ InflightLimit >= 1
ASSUME MaxCrashes \in Nat /\ MaxFragments \in Nat /\ MaxFragments >= 1
ASSUME LostAcks \in BOOLEAN

Unbounded == Mode = "unbounded"

(***************************************************************************)
(* Entry ids and values.  Ids start at 0; -1 means "none" (as in the       *)
(* wire protocol).  A value records who wrote it: <<t, "data">> is the     *)
(* entry the writer of term t added, <<t, "noop">> the no-op that the      *)
(* recovery of term t wrote.  Whether a no-op request carries the truncate *)
(* flag is a property of the request (TruncateFlag below).  Every term     *)
(* adds at most one no-op, so ids up to MaxDataId + MaxTerm - 1 suffice.   *)
(***************************************************************************)
IdMax == IF Unbounded THEN MaxDataId + MaxTerm - 1 ELSE MaxDataId + 1
Ids == 0 .. IdMax
NoVal == <<0, "none">>
Data(t) == <<t, "data">>
NoOp(t) == <<t, "noop">>
IsNoOp(v) == v[2] = "noop"

Max2(a, b) == IF a >= b THEN a ELSE b
MaxOf(S) == CHOOSE x \in S : \A y \in S : y <= x

(***************************************************************************)
(* Ensembles and write sets.                                               *)
(***************************************************************************)
E == Cardinality(Ensemble0)          \* the ensemble size
Striped == WQ < E

Range(s) == {s[i] : i \in DOMAIN s}

\* The first ensemble in its order.  Model checking: any order (only Init
\* names it; renaming the bookies maps one order to another); trace
\* validation overrides it with the run's (tla/tracecheck.py's cfg).
Ensemble0Order == CHOOSE s \in [1 .. E -> Ensemble0] : Range(s) = Ensemble0

\* An ensemble as the state keeps it (see the module's comment): the
\* sequence when striped, else its set of bookies; Members: its bookies.
Canon(seq) == IF Striped THEN seq ELSE Range(seq)
Members(ens) == IF Striped THEN Range(ens) ELSE ens
NoEns == Canon(<<>>)

\* The write set starting at position s (0-based): the WQ bookies from s,
\* wrapping; entry n's is the one from n mod E (stream/quorum.py write_set).
WriteSetAt(s, ens) == IF Striped THEN {ens[((s + k) % E) + 1] : k \in 0 .. WQ - 1} ELSE ens
WriteSetOf(n, ens) == WriteSetAt(n % E, ens)
\* The distinct write sets of an ensemble (one if E = WQ).
Quorums(ens) == {WriteSetAt(s, ens) : s \in 0 .. E - 1}

\* The ensembles of E bookies out of S (a roll's new ensemble).
EnsemblesOf(S) ==
    IF Striped THEN {s \in [1 .. E -> S] : Cardinality(Range(s)) = E}
               ELSE {x \in SUBSET S : Cardinality(x) = E}

\* ens with each bookie b of DOMAIN rep replaced by rep[b], in its position
\* (an ensemble change: the replacement takes over the write sets of b).
\* The mutant replacement_appended (one bookie replaced) drops b and puts
\* rep[b] last: the kept bookies move, and with them the write sets.
Replace(ens, rep) ==
    IF ~Striped THEN (ens \ DOMAIN rep) \cup Range(rep)
    ELSE IF Mutant = "replacement_appended" /\ Cardinality(DOMAIN rep) = 1
    THEN SelectSeq(ens, LAMBDA x : x \notin DOMAIN rep) \o <<rep[CHOOSE b \in DOMAIN rep : TRUE]>>
    ELSE [i \in DOMAIN ens |-> IF ens[i] \in DOMAIN rep THEN rep[ens[i]] ELSE ens[i]]

(***************************************************************************)
(* Fragments: <<[first, ens], ...>>, ordered by first entry.               *)
(***************************************************************************)
FragIndex(n, frags) ==
    CHOOSE i \in DOMAIN frags :
        /\ frags[i].first <= n
        /\ \/ i = Len(frags)
           \/ frags[i + 1].first > n

WriteSet(n, frags) == WriteSetOf(n, frags[FragIndex(n, frags)].ens)
LastFrag(frags) == frags[Len(frags)]

(***************************************************************************)
(* Quorum coverage.  Any AQ bookies of a write set meet any Coverage       *)
(* bookies of it.  A fencing read has coverage once, in EVERY write set of *)
(* the ensemble, Coverage bookies answered (stream/quorum.py               *)
(* CoverageTracker): then no write set has AQ bookies that did not answer, *)
(* so an older writer can have no add acknowledged without a fenced        *)
(* bookie.  With E = WQ that is Coverage bookies of the ensemble, which    *)
(* the mutant coverage_over_ensemble counts whatever E.                    *)
(***************************************************************************)
Coverage == WQ - AQ + 1

Covered(fenced, ens) ==
    IF Mutant = "coverage_over_ensemble"
    THEN Cardinality(fenced \cap Members(ens)) >= Coverage
    ELSE \A q \in Quorums(ens) : Cardinality(fenced \cap q) >= Coverage

(***************************************************************************)
(* LAC and LAFR: computed contiguously, moving up from the previous value: *)
(* the highest m >= from such that every id in from+1..m has q acks.       *)
(***************************************************************************)
Advance(from, ack, q) ==
    MaxOf({m \in from .. IdMax : \A i \in (from + 1) .. m : Cardinality(ack[i]) >= q})

VARIABLES
    bk,       \* bk[b]: bookie b's state for this ledger:
              \*   term, fenced (classic), ents (id -> value or NoVal), lac, lafr
    crashed,  \* bookies that crashed: they answer nothing (and lose nothing)
    meta,     \* the ledger's metadata in etcd:
              \*   state, term, frags (<<[first, ens]>>), last (CLOSED only)
    cl,       \* cl[c]: client c (see IdleClient)
    acked     \* history: <<id, value>> pairs acknowledged to an application

vars == <<bk, crashed, meta, cl, acked>>

(***************************************************************************)
(* Client state.  phase:                                                   *)
(*   "idle"       not engaged (never was, or withdrew)                     *)
(*   "fencing"    took the ledger over; sends fencing LAC/LAFR reads       *)
(*   "reading"    reads forward, one entry (next) at a time                *)
(*   "finishing"  found the end; waits until every recovery write reached  *)
(*                Qw, then CASes the metadata (OPEN / CLOSED)              *)
(*   "open"       the writer of its term: adds entries                     *)
(* val/ack hold the writes not yet released: the value and the bookies     *)
(* that acknowledged it.  lac/lafr are the writer's LAC and LAFR; during   *)
(* recovery they are the values the fencing reads returned, frozen: the    *)
(* recovery writes carry them.  lap is the last add pushed.  fenced: the   *)
(* bookies that answered a fencing read; next, nosuch: the entry being     *)
(* read forward and the bookies that said NoSuchEntry; rens: during       *)
(* recovery, the last ensemble as published at take-over, which the        *)
(* fencing reads go to (recovery reads: to next's write set in it).        *)
(***************************************************************************)
IdleClient ==
    [phase  |-> "idle",
     term   |-> 0,
     frags  |-> <<>>,
     lac    |-> -1,
     lafr   |-> -1,
     lap    |-> -1,
     val    |-> [i \in Ids |-> NoVal],
     ack    |-> [i \in Ids |-> {}],
     fenced |-> {},
     next   |-> 0,
     nosuch |-> {},
     floor  |-> 0,
     rens   |-> NoEns]

Recovering(c) == cl[c].phase \in {"fencing", "reading", "finishing"}

\* A writer releases a pending add at Qw (unbounded: guaranteed write quorum,
\* rule 1) or at Qa (classic; the mutant release_at_qa: unbounded too).
Released(w) == IF Unbounded /\ Mutant # "release_at_qa" THEN w.lafr ELSE w.lac

(***************************************************************************)
(* Bookie rules.                                                           *)
(***************************************************************************)
\* Storing an add; a truncating add deletes every higher entry.
Store(ents, n, v, truncate) ==
    [i \in Ids |-> IF i = n THEN v
                   ELSE IF truncate /\ i > n THEN NoVal
                   ELSE ents[i]]

\* Is client c's add accepted by bookie b?  Unbounded: a term >= the bookie's.
\* Classic: a fenced bookie refuses normal adds, accepts recovery adds.
AddAccepted(w, b) ==
    IF Unbounded THEN bk[b].term <= w.term
                 ELSE w.phase # "open" \/ ~bk[b].fenced

\* Fencing LAC reads ("fence") and recovery reads ("entry") carry the term
\* (classic: the fence flag); the mutants drop it from both, or from the
\* recovery reads only.
CarriesTerm(kind) ==
    CASE Mutant = "recovery_reads_no_term" -> FALSE
      [] Mutant = "entry_reads_no_term"    -> kind = "fence"
      [] OTHER                             -> TRUE

ReadAccepted(w, b, kind) ==
    ~Unbounded \/ ~CarriesTerm(kind) \/ bk[b].term <= w.term

\* The effect of a fencing or recovery read on the bookie's state.
AfterRead(st, w, kind) ==
    IF Unbounded
    THEN [st EXCEPT !.term = IF CarriesTerm(kind) THEN w.term ELSE @]
    ELSE [st EXCEPT !.fenced = @ \/ CarriesTerm(kind)]

\* Does client c's add of entry n carry the truncate flag?  Only the no-op
\* that ends this term's recovery does (unless a mutant says otherwise).
TruncateFlag(w, n) ==
    /\ Unbounded
    /\ Mutant # "no_truncate"
    /\ IsNoOp(w.val[n])
    /\ \/ w.phase = "finishing" /\ n = w.next
       \/ Mutant = "writeback_truncates" /\ w.phase \in {"reading", "finishing"}

\* The no-op that ends this term's recovery (unbounded).
NoOpEnd(w, n) == Unbounded /\ w.phase = "finishing" /\ n = w.next

\* Where client c sends entry n: its write set, except the no-op that ends a
\* recovery: to every bookie of the last ensemble, since any of them may hold
\* entries above it that its truncate flag must delete (with E = WQ the
\* same bookies; the mutant noop_to_write_set: its write set only).
Targets(w, n) ==
    IF NoOpEnd(w, n) /\ Mutant # "noop_to_write_set"
    THEN Members(LastFrag(w.frags).ens) ELSE WriteSet(n, w.frags)

=============================================================================
