-------------------------- MODULE BookstreamRejoin --------------------------
(***************************************************************************)
(* A bookie that lost its disk and comes back under its old id             *)
(* (bookie/cookie.py, --on-lost-disk rejoin and `bookies cookie delete`),  *)
(* and a writer cut off from the metadata (a zombie) that still sends to   *)
(* it.                                                                     *)
(*                                                                         *)
(* One ledger, its one fragment's ensemble Ens (Qw = |Ens|, Qa), a zombie  *)
(* writer whose cached ensemble is Ens for good (it never hears of the     *)
(* recovery or the replacement: that is what makes it a zombie), and one   *)
(* recovery by another client: it fences a set of at least Qw - Qa + 1     *)
(* bookies that answer, reads the longest run of entries they hold, writes *)
(* it back to them and closes the ledger there.  The fence is the classic  *)
(* ledger's; an unbounded ledger's raised term refuses the zombie's older  *)
(* term the same way, and its take-over's recovery decides the old term's  *)
(* end the same way, so one model serves both.  The recovery is one step   *)
(* (the main spec, BookstreamLedger.tla, has it step by step, adds racing  *)
(* it): the hole modelled here opens after it.                             *)
(*                                                                         *)
(* Faults: a bookie stops and starts again with its state (fsync before    *)
(* ack), or loses its disk (at most MaxLosses times): it stops, its        *)
(* entries and its fence gone.  Its cookie then refuses a normal start.    *)
(* Autorecovery replaces a stopped bookie of the closed ledger by Spare,   *)
(* copying the closed range there (BookstreamCopy.tla models the copy).    *)
(*                                                                         *)
(* The two rules of the way back:                                          *)
(*   - the lost bookie starts under its id only once no ledger names it    *)
(*     (cookie.holds_id); mutant "rejoin_while_named" drops this one;      *)
(*   - once back, a ledger older than the rejoin (here: the one ledger)    *)
(*     takes no normal add there, READ_ONLY (bookie/core.py rejoined_at);  *)
(*     mutant "no_barrier" drops this one: the zombie's add, refused by    *)
(*     the fenced bookies, finds Qa among the one recovery did not fence   *)
(*     and the one that lost its fence with its disk.                      *)
(* Each mutant breaks ClosedCoversAcked.  A ledger created after the       *)
(* rejoin uses the bookie fully; it is not modelled (no writer of it can   *)
(* be a zombie of a fence the disk held).                                  *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets, TLC

CONSTANTS Ens, Spare, Qa, N, MaxLosses, Mutant

ASSUME Mutant \in {"none", "no_barrier", "rejoin_while_named"}
ASSUME Qa \in 1..Cardinality(Ens) /\ Spare \notin Ens
\* Qa copies of an entry survive Qa - 1 lost disks, no more (AckedDurable).
ASSUME MaxLosses < Qa

Qw == Cardinality(Ens)
Entries == 1..N
Bookies == Ens \cup {Spare}

VARIABLES
    status,    \* status[b]: "up" (registered, serving) or "down"
    held,      \* held[b]: the ledger's entries b holds
    fenced,    \* fenced[b]: the recovery's fence (an unbounded ledger: its term raised)
    lostDisk,  \* lostDisk[b]: b's disk was lost and b has not rejoined (its cookie refuses a start)
    rejoined,  \* rejoined[b]: b came back under its id after a lost disk (its cookie's rejoined_at)
    losses,    \* disks lost so far
    named,     \* the bookies the ledger's metadata names (its one fragment)
    sent,      \* the zombie's entries 1..sent are on their way to the bookies
    acks,      \* acks[e]: the bookies that acknowledged the zombie's add of e
    closed,    \* the recovery closed the ledger
    closedEnd  \* ... at this entry

vars == <<status, held, fenced, lostDisk, rejoined, losses, named, sent, acks, closed, closedEnd>>

TypeOK ==
    /\ status \in [Bookies -> {"up", "down"}]
    /\ held \in [Bookies -> SUBSET Entries]
    /\ fenced \in [Bookies -> BOOLEAN]
    /\ lostDisk \in [Bookies -> BOOLEAN]
    /\ rejoined \in [Bookies -> BOOLEAN]
    /\ losses \in 0..MaxLosses
    /\ named \subseteq Bookies
    /\ sent \in 0..N
    /\ acks \in [Entries -> SUBSET Ens]
    /\ closed \in BOOLEAN
    /\ closedEnd \in 0..N

Init ==
    /\ status = [b \in Bookies |-> "up"]
    /\ held = [b \in Bookies |-> {}]
    /\ fenced = [b \in Bookies |-> FALSE]
    /\ lostDisk = [b \in Bookies |-> FALSE]
    /\ rejoined = [b \in Bookies |-> FALSE]
    /\ losses = 0
    /\ named = Ens
    /\ sent = 0
    /\ acks = [e \in Entries |-> {}]
    /\ closed = FALSE
    /\ closedEnd = 0

\* The zombie's client acknowledges entries in order, each at Qa acks.
Acked(e) == \A x \in 1..e : Cardinality(acks[x]) >= Qa

\* The zombie sends its next entry (to every bookie of its ensemble; the
\* requests arrive whenever, ZombieAdd).
ZombieSend ==
    /\ sent < N
    /\ sent' = sent + 1
    /\ UNCHANGED <<status, held, fenced, lostDisk, rejoined, losses, named, acks, closed, closedEnd>>

\* Bookie b takes (or refuses) the zombie's add of e.
ZombieAdd(e, b) ==
    /\ e <= sent /\ status[b] = "up" /\ b \notin acks[e]
    /\ ~fenced[b]                                  \* FENCED
    /\ ~rejoined[b] \/ Mutant = "no_barrier"       \* READ_ONLY: a ledger older than the rejoin
    /\ held' = [held EXCEPT ![b] = @ \cup {e}]
    /\ acks' = [acks EXCEPT ![e] = @ \cup {b}]
    /\ UNCHANGED <<status, fenced, lostDisk, rejoined, losses, named, sent, closed, closedEnd>>

\* The longest run of entries from 1 that some bookie of F holds.
RunEnd(F) ==
    LET found == UNION {held[f] : f \in F}
    IN  CHOOSE k \in 0..N : (\A x \in 1..k : x \in found) /\ (k = N \/ (k + 1) \notin found)

\* The recovery: F answers its fencing reads; what F holds is written back
\* to F (recovery adds pass the fence) and the ledger closed at its end.
Recover ==
    /\ ~closed
    /\ \E F \in SUBSET Ens :
        /\ Cardinality(F) >= Qw - Qa + 1
        /\ \A f \in F : status[f] = "up"
        /\ LET end == RunEnd(F) IN
            /\ fenced' = [b \in Bookies |-> IF b \in F THEN TRUE ELSE fenced[b]]
            /\ held' = [b \in Bookies |-> IF b \in F THEN held[b] \cup 1..end ELSE held[b]]
            /\ closed' = TRUE
            /\ closedEnd' = end
    /\ UNCHANGED <<status, lostDisk, rejoined, losses, named, sent, acks>>

Stop(b) ==
    /\ status[b] = "up"
    /\ status' = [status EXCEPT ![b] = "down"]
    /\ UNCHANGED <<held, fenced, lostDisk, rejoined, losses, named, sent, acks, closed, closedEnd>>

\* A start on the disk it had (the cookie matches).
Start(b) ==
    /\ status[b] = "down" /\ ~lostDisk[b]
    /\ status' = [status EXCEPT ![b] = "up"]
    /\ UNCHANGED <<held, fenced, lostDisk, rejoined, losses, named, sent, acks, closed, closedEnd>>

LoseDisk(b) ==
    /\ b \in Ens /\ losses < MaxLosses
    /\ losses' = losses + 1
    /\ status' = [status EXCEPT ![b] = "down"]
    /\ held' = [held EXCEPT ![b] = {}]
    /\ fenced' = [fenced EXCEPT ![b] = FALSE]
    /\ lostDisk' = [lostDisk EXCEPT ![b] = TRUE]
    /\ UNCHANGED <<rejoined, named, sent, acks, closed, closedEnd>>

\* Autorecovery replaces a lost (unregistered) bookie of the closed ledger
\* by Spare, the closed range copied there.
Replace(b) ==
    /\ closed /\ b \in named /\ b # Spare /\ Spare \notin named /\ status[b] = "down"
    /\ named' = (named \ {b}) \cup {Spare}
    /\ held' = [held EXCEPT ![Spare] = 1..closedEnd]
    /\ UNCHANGED <<status, fenced, lostDisk, rejoined, losses, sent, acks, closed, closedEnd>>

\* The lost bookie starts under its old id: once no ledger names it.
Rejoin(b) ==
    /\ status[b] = "down" /\ lostDisk[b]
    /\ b \notin named \/ Mutant = "rejoin_while_named"
    /\ status' = [status EXCEPT ![b] = "up"]
    /\ lostDisk' = [lostDisk EXCEPT ![b] = FALSE]
    /\ rejoined' = [rejoined EXCEPT ![b] = TRUE]
    /\ UNCHANGED <<held, fenced, losses, named, sent, acks, closed, closedEnd>>

Next ==
    \/ ZombieSend
    \/ Recover
    \/ \E b \in Bookies : Stop(b) \/ Start(b) \/ LoseDisk(b) \/ Replace(b) \/ Rejoin(b)
    \/ \E e \in Entries, b \in Ens : ZombieAdd(e, b)

Spec == Init /\ [][Next]_vars

\* Nothing the zombie's client was told is acknowledged lies past the end
\* the recovery closed the ledger at.
ClosedCoversAcked == closed => \A e \in Entries : Acked(e) => e <= closedEnd

\* Every acknowledged entry has a copy on a bookie the metadata names.
AckedDurable == \A e \in Entries : Acked(e) => \E b \in named : e \in held[b]

Symmetry == Permutations(Ens)
=============================================================================
