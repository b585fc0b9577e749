--------------------------- MODULE BookstreamCopy ---------------------------
(***************************************************************************)
(* Autorecovery's copy of one sealed fragment's lost position to a target  *)
(* bookie, under the ledger's recovery lock in etcd                        *)
(* (stream/autorecovery/copier.py, service.py recover_ledger_fragments).   *)
(*                                                                         *)
(* A worker takes the lock (an etcd key under its lease; the key's create  *)
(* revision is the hold's fencing token), clears the fragment's range on   *)
(* a target it chooses, copies the entries there, and publishes the        *)
(* replacement by CAS on the ledger's metadata.  Its lease may expire at   *)
(* any moment (a worker paused by GC or SIGSTOP, cut off from etcd): it    *)
(* goes on unaware, and another worker may take the lock meanwhile.  The   *)
(* worker's reads of its lock before each step are not modelled: the       *)
(* worst case, a pause just after such a read, is every step here.         *)
(*                                                                         *)
(* The two rules that keep a stale worker harmless:                        *)
(*   - the target refuses a clearing whose token is below the highest it   *)
(*     has seen for the ledger (bookie/core.py admit_clear);               *)
(*   - the replacement's transaction is guarded on the lock key still      *)
(*     created at the worker's token (metadata.txn.created_at).            *)
(* Mutant "no_fence" drops the first, "no_guard" the second: each breaks   *)
(* PublishedHolds.                                                         *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets, TLC

CONSTANTS Workers, Targets, Entries, MaxLocks, Mutant

ASSUME Mutant \in {"none", "no_fence", "no_guard"}

None == "none"
Lost == "lost"

VARIABLES
    rev,        \* etcd's revision: each lock taken is a new key, a new create revision
    lock,       \* [holder |-> a worker or None, created |-> its create revision (0: no key)]
    meta,       \* the fragment's bookie at the lost position: Lost, or the target published
    data,       \* data[t]: the fragment's entries target t holds
    seen,       \* seen[t]: the highest copy token target t has admitted for the ledger
    pc, token, tgt, copied

vars == <<rev, lock, meta, data, seen, pc, token, tgt, copied>>

TypeOK ==
    /\ rev \in 0..MaxLocks
    /\ lock \in [holder : Workers \cup {None}, created : 0..MaxLocks]
    /\ meta \in Targets \cup {Lost}
    /\ data \in [Targets -> SUBSET Entries]
    /\ seen \in [Targets -> 0..MaxLocks]
    /\ pc \in [Workers -> {"idle", "locked", "copying", "copied"}]
    /\ token \in [Workers -> 0..MaxLocks]
    /\ tgt \in [Workers -> Targets \cup {None}]
    /\ copied \in [Workers -> SUBSET Entries]

Init ==
    /\ rev = 0
    /\ lock = [holder |-> None, created |-> 0]
    /\ meta = Lost
    /\ data = [t \in Targets |-> {}]
    /\ seen = [t \in Targets |-> 0]
    /\ pc = [w \in Workers |-> "idle"]
    /\ token = [w \in Workers |-> 0]
    /\ tgt = [w \in Workers |-> None]
    /\ copied = [w \in Workers |-> {}]

Holds(w) == lock.holder = w /\ lock.created = token[w]

\* A worker done with its task (finished, moot, or failed): it releases the
\* lock if the lock is still its hold.
Release(w) ==
    /\ pc' = [pc EXCEPT ![w] = "idle"]
    /\ tgt' = [tgt EXCEPT ![w] = None]
    /\ copied' = [copied EXCEPT ![w] = {}]
    /\ lock' = IF Holds(w) THEN [holder |-> None, created |-> 0] ELSE lock

Lock(w) ==
    /\ pc[w] = "idle" /\ lock.holder = None /\ meta = Lost /\ rev < MaxLocks
    /\ rev' = rev + 1
    /\ lock' = [holder |-> w, created |-> rev + 1]
    /\ token' = [token EXCEPT ![w] = rev + 1]
    /\ pc' = [pc EXCEPT ![w] = "locked"]
    /\ UNCHANGED <<meta, data, seen, tgt, copied>>

\* The lease expires (the holder paused or cut off): etcd deletes the key.
Expire ==
    /\ lock.holder # None
    /\ lock' = [holder |-> None, created |-> 0]
    /\ UNCHANGED <<rev, meta, data, seen, pc, token, tgt, copied>>

\* The clearing of the target's range, carrying the hold's token.
Clear(w, t) ==
    /\ pc[w] = "locked"
    /\ IF seen[t] > token[w] /\ Mutant # "no_fence"
       THEN /\ Release(w)                                    \* FENCED: CopyFailed
            /\ UNCHANGED <<rev, meta, data, seen, token>>
       ELSE /\ data' = [data EXCEPT ![t] = {}]
            /\ seen' = [seen EXCEPT ![t] = IF token[w] > @ THEN token[w] ELSE @]
            /\ tgt' = [tgt EXCEPT ![w] = t]
            /\ pc' = [pc EXCEPT ![w] = "copying"]
            /\ UNCHANGED <<rev, lock, meta, token, copied>>

\* One entry copied (recovery adds are not fenced: every copy is the same bytes).
CopyOne(w, e) ==
    /\ pc[w] = "copying" /\ e \notin copied[w]
    /\ data' = [data EXCEPT ![tgt[w]] = @ \cup {e}]
    /\ copied' = [copied EXCEPT ![w] = @ \cup {e}]
    /\ pc' = [pc EXCEPT ![w] = IF copied'[w] = Entries THEN "copied" ELSE "copying"]
    /\ UNCHANGED <<rev, lock, meta, seen, token, tgt>>

\* The replacement's CAS: moot once another published; refused by its guard
\* once the lock is not this hold.
Publish(w) ==
    /\ pc[w] = "copied"
    /\ meta' = IF meta = Lost /\ (Holds(w) \/ Mutant = "no_guard") THEN tgt[w] ELSE meta
    /\ Release(w)
    /\ UNCHANGED <<rev, data, seen, token>>

Next ==
    \/ Expire
    \/ \E w \in Workers :
        \/ Lock(w)
        \/ Publish(w)
        \/ \E t \in Targets : Clear(w, t)
        \/ \E e \in Entries : CopyOne(w, e)

Spec == Init /\ [][Next]_vars

\* A published target holds every entry of the position it replaced.
PublishedHolds == meta # Lost => data[meta] = Entries

Symmetry == Permutations(Workers) \cup Permutations(Targets)
=============================================================================
