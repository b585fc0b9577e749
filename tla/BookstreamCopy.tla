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
(*                                                                         *)
(* Each target also runs its over-replicated GC (bookie/ledger_gc.py): it  *)
(* takes the same lock, reads the metadata (the fragment does not name it *)
(* while it holds entries), then, maybe long after, clears the range with *)
(* the lock's token (bookie/core.py admit_gc_clear: below the highest     *)
(* token seen, FENCED).  The fragment is sealed, so the count of requests *)
(* admitted since the read is not asked (it is for an open ledger's end). *)
(* Mutant "gc_no_lock": the GC clears without the lock (a token above     *)
(* every copy's); "gc_no_fence": its clearing is admitted for any token.   *)
(* Each breaks PublishedHolds.                                             *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets, TLC

CONSTANTS Workers, Targets, Entries, MaxLocks, Mutant

ASSUME Mutant \in {"none", "no_fence", "no_guard", "gc_no_lock", "gc_no_fence"}

None == "none"
Lost == "lost"

VARIABLES
    rev,        \* etcd's revision: each lock taken is a new key, a new create revision
    lock,       \* [holder |-> a worker or None, created |-> its create revision (0: no key)]
    meta,       \* the fragment's bookie at the lost position: Lost, or the target published
    data,       \* data[t]: the fragment's entries target t holds
    seen,       \* seen[t]: the highest copy token target t has admitted for the ledger
    pc, token, tgt, copied,
    gc,         \* gc[t]: target t's over-replicated GC: "idle", "locked", "read" (found itself not named)
    gcToken     \* gcToken[t]: its hold's token

vars == <<rev, lock, meta, data, seen, pc, token, tgt, copied, gc, gcToken>>

TypeOK ==
    /\ rev \in 0..MaxLocks
    /\ lock \in [holder : Workers \cup Targets \cup {None}, created : 0..MaxLocks]
    /\ meta \in Targets \cup {Lost}
    /\ data \in [Targets -> SUBSET Entries]
    /\ seen \in [Targets -> 0..MaxLocks]
    /\ pc \in [Workers -> {"idle", "locked", "copying", "copied"}]
    /\ token \in [Workers -> 0..MaxLocks]
    /\ tgt \in [Workers -> Targets \cup {None}]
    /\ copied \in [Workers -> SUBSET Entries]
    /\ gc \in [Targets -> {"idle", "locked", "read"}]
    /\ gcToken \in [Targets -> 0..MaxLocks]

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
    /\ gc = [t \in Targets |-> "idle"]
    /\ gcToken = [t \in Targets |-> 0]

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
    /\ UNCHANGED <<meta, data, seen, tgt, copied, gc, gcToken>>

\* The lease expires (the holder paused or cut off): etcd deletes the key.
Expire ==
    /\ lock.holder # None
    /\ lock' = [holder |-> None, created |-> 0]
    /\ UNCHANGED <<rev, meta, data, seen, pc, token, tgt, copied, gc, gcToken>>

\* The clearing of the target's range, carrying the hold's token.
Clear(w, t) ==
    /\ pc[w] = "locked"
    /\ IF seen[t] > token[w] /\ Mutant # "no_fence"
       THEN /\ Release(w)                                    \* FENCED: CopyFailed
            /\ UNCHANGED <<rev, meta, data, seen, token, gc, gcToken>>
       ELSE /\ data' = [data EXCEPT ![t] = {}]
            /\ seen' = [seen EXCEPT ![t] = IF token[w] > @ THEN token[w] ELSE @]
            /\ tgt' = [tgt EXCEPT ![w] = t]
            /\ pc' = [pc EXCEPT ![w] = "copying"]
            /\ UNCHANGED <<rev, lock, meta, token, copied, gc, gcToken>>

\* One entry copied (recovery adds are not fenced: every copy is the same bytes,
\* because a copy takes an id only from a bookie of its write set,
\* FragmentJob.replica_of; a record elsewhere in the range may be a leftover
\* of another term's fragment, which this module does not model).
CopyOne(w, e) ==
    /\ pc[w] = "copying" /\ e \notin copied[w]
    /\ data' = [data EXCEPT ![tgt[w]] = @ \cup {e}]
    /\ copied' = [copied EXCEPT ![w] = @ \cup {e}]
    /\ pc' = [pc EXCEPT ![w] = IF copied'[w] = Entries THEN "copied" ELSE "copying"]
    /\ UNCHANGED <<rev, lock, meta, seen, token, tgt, gc, gcToken>>

\* The replacement's CAS: moot once another published; refused by its guard
\* once the lock is not this hold.
Publish(w) ==
    /\ pc[w] = "copied"
    /\ meta' = IF meta = Lost /\ (Holds(w) \/ Mutant = "no_guard") THEN tgt[w] ELSE meta
    /\ Release(w)
    /\ UNCHANGED <<rev, data, seen, token, gc, gcToken>>

\* Target t's GC takes the ledger's lock (the mutant: no lock, a fresh token).
GcLock(t) ==
    /\ gc[t] = "idle" /\ data[t] # {} /\ rev < MaxLocks
    /\ IF Mutant = "gc_no_lock" THEN UNCHANGED lock
       ELSE lock.holder = None /\ lock' = [holder |-> t, created |-> rev + 1]
    /\ rev' = rev + 1
    /\ gcToken' = [gcToken EXCEPT ![t] = rev + 1]
    /\ gc' = [gc EXCEPT ![t] = "locked"]
    /\ UNCHANGED <<meta, data, seen, pc, token, tgt, copied>>

GcDone(t) ==
    /\ gc' = [gc EXCEPT ![t] = "idle"]
    /\ lock' = IF lock.holder = t /\ lock.created = gcToken[t] THEN [holder |-> None, created |-> 0] ELSE lock

\* It reads the metadata under the lock: the fragment does not name it.
GcRead(t) ==
    /\ gc[t] = "locked"
    /\ IF meta # t /\ data[t] # {}
       THEN /\ gc' = [gc EXCEPT ![t] = "read"] /\ UNCHANGED lock
       ELSE GcDone(t)
    /\ UNCHANGED <<rev, meta, data, seen, pc, token, tgt, copied, gcToken>>

\* Its clearing, with the hold's token, maybe long after the read.
GcClear(t) ==
    /\ gc[t] = "read"
    /\ IF seen[t] > gcToken[t] /\ Mutant # "gc_no_fence"
       THEN UNCHANGED <<data, seen>>                              \* FENCED: a later copy is here
       ELSE /\ data' = [data EXCEPT ![t] = {}]
            /\ seen' = [seen EXCEPT ![t] = IF gcToken[t] > @ THEN gcToken[t] ELSE @]
    /\ GcDone(t)
    /\ UNCHANGED <<rev, meta, pc, token, tgt, copied, gcToken>>

Next ==
    \/ Expire
    \/ \E t \in Targets : GcLock(t) \/ GcRead(t) \/ GcClear(t)
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
