"""The re-replication job's decisions on the driver, as pure code (no I/O,
no Spark): the job's tasks, one per fragment to copy, with the target each
is sent to, and the job's summary folded from the tasks' results.

What to copy is the autorecovery planner's (``worker_core.plan_ledger``:
one :class:`FragmentJob` per sealed fragment naming the lost bookie);
whether a copy may replace the bookie is the life-cycle core's
(``ReplaceBookie``), judged again in the task on the metadata of that
moment.  Here only:

- :func:`assign_targets` -- a target per job that is never a member of the
  job's fragment nor the lost bookie (so no fragment ever holds two copies
  on one bookie), spread over the eligible bookies: the one with the fewest
  entries assigned so far, ties in the placement policy's order
  (``stream/placement.py``), the largest jobs first;
- :func:`fragment_status` -- a task's verdict: ``done`` (this task's CAS,
  or an identical one it adopted, replaced the bookie), ``skipped`` (nothing
  left to do: already replaced, the fragment changed or was trimmed, the
  ledger is gone), ``failed`` (left: a failed copy, a replacement that had
  to wait, entries no replica holds);
- :func:`summarize` -- the summary of ``bookstream recover`` (same keys),
  with the per-fragment results.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Iterable, Sequence

from stream.autorecovery.worker_core import FragmentJob
from stream.errors import NotEnoughBookies
from stream.placement import PlacementPolicy, eligible

DONE, SKIPPED, FAILED = "done", "skipped", "failed"


@dataclasses.dataclass(frozen=True)
class FragmentTask:
    """One Spark task: copy fragment ``first``..``last`` of ``ledger_id``
    off ``lost`` to ``target`` (None: the task's placement chooses), then
    replace ``lost`` by CAS.  Plain values: sent to an executor."""

    ledger_id: int
    first: int
    last: int
    lost: str
    target: str | None
    entries: int

    def as_json(self) -> dict:
        return dataclasses.asdict(self)


def assign_targets(jobs: Sequence[FragmentJob], candidates: Sequence, lost: str, policy: PlacementPolicy,
                   to: str | None = None) -> list[FragmentTask]:
    """One task per job, in the jobs' order.  ``candidates``: the bookie
    registrations (``bookie_id``, ``read_only``, ``free_bytes``); ``to``: the
    user's target, used wherever it is not in the fragment already."""
    load: collections.Counter[str] = collections.Counter()
    chosen: dict[int, str | None] = {}
    for k in sorted(range(len(jobs)), key=lambda k: -jobs[k].entries):  # the largest first
        job = jobs[k]
        assert job.lost == lost, (job, lost)
        exclude = set(job.ensemble) | {lost}
        if to is not None and to not in exclude:
            pick: str | None = to
        else:
            try:
                pool = eligible(candidates, 1, exclude)
                order = policy.choose(pool, len(pool), exclude)
            except NotEnoughBookies:
                pick = None  # the task asks the placement again (a bookie may have registered since)
            else:
                rank = {b: i for i, b in enumerate(order)}
                pick = min(order, key=lambda b: (load[b], rank[b]))
        if pick is not None:
            assert pick not in job.ensemble and pick != lost, (pick, job)
            load[pick] += job.entries
        chosen[k] = pick
    return [FragmentTask(j.ledger_id, j.first_entry, j.last_entry, j.lost, chosen[k], j.entries)
            for k, j in enumerate(jobs)]


def fragment_status(replaced: bool, step: str) -> str:
    """A task's verdict from its outcome: the bookie replaced in the
    fragment (by this task, or adopted), else the recovery's last step
    (``done``: nothing of the fragment is left to do)."""
    if replaced:
        return DONE
    return SKIPPED if step == "done" else FAILED


def summarize(bookie: str, plans: Iterable[tuple[int, object]], results: Sequence[dict], *, seconds: float,
              left: Sequence[dict] = (), extra: dict | None = None) -> dict:
    """The job's summary, with the keys of ``bookstream recover``'s:
    ``plans`` as planned (ledger id, ``LedgerPlan``), ``results`` one per
    task (``status``, ``entries``, ``bytes``, ``unrecoverable``, ...),
    ``left`` what the driver itself left (open fragments not sealed)."""
    plans = list(plans)
    s = {"bookie": bookie, "dry_run": False, "ledgers": len(plans),
         "fragments_planned": sum(len(p.jobs) for _, p in plans),
         "entries_planned": sum(j.entries for _, p in plans for j in p.jobs),
         "unrecoverable": [dict(ledger_id=lid, first=u.first_entry, last=u.last_entry, why=u.why)
                           for lid, p in plans for u in p.unrecoverable],
         "fragments_replaced": sum(1 for r in results if r["status"] == DONE),
         "fragments_skipped": sum(1 for r in results if r["status"] == SKIPPED),
         "fragments_failed": sum(1 for r in results if r["status"] == FAILED),
         "entries_copied": sum(r["entries"] for r in results),
         "bytes_copied": sum(r["bytes"] for r in results),
         "left": list(left), "fragments": sorted(results, key=lambda r: (r["ledger_id"], r["first"]))}
    for r in s["fragments"]:
        s["unrecoverable"] += [dict(u, ledger_id=r["ledger_id"]) for u in r.get("unrecoverable", ())]
        if r["status"] == FAILED:
            s["left"].append({"ledger_id": r["ledger_id"], "first": r["first"], "step": r["step"],
                              "note": r["note"], "open_fragment": None})
    s["open_fragments"] = [[x["ledger_id"], x["open_fragment"]] for x in s["left"]
                           if x.get("open_fragment") is not None]
    s["seconds"] = round(seconds, 3)
    s["mb_per_s"] = round(s["bytes_copied"] / 1e6 / seconds, 2) if seconds > 0 else 0.0
    s["entries_per_s"] = round(s["entries_copied"] / seconds, 1) if seconds > 0 else 0.0
    s.update(extra or {})
    return s


__all__ = ["FragmentTask", "assign_targets", "fragment_status", "summarize", "DONE", "SKIPPED", "FAILED"]
