"""The bookie's cookie (BookKeeper's ``Cookie``): who a data dir belongs to,
kept twice, as the file ``cookie`` in the data dir and as the etcd key
``cookies/<bookie id>``, and compared at every start before the bookie
serves anything.

The protocol assumes a bookie never forgets what it acknowledged.  A bookie
whose disk was lost (a replaced volume, a Kubernetes pod whose claim was
recreated) and which comes back under its old id answers NO_SUCH_LEDGER and
NO_SUCH_ENTRY for entries it acknowledged.  A writer's recovery counts Qw -
Qa + 1 such answers as proof that an entry was never acknowledged and
truncates there: with E3 Qw3 Qa2, an entry acknowledged by this bookie and
one other, the third never having had it, is lost.  The empty bookie also
has no term and no fence left: an old writer fenced there writes again.
And a bookie started against a rebuilt or another cluster's etcd would find
none of its ledgers listed, and its ledger GC (bookie/ledger_gc.py) would
delete them all.

A cookie names the bookie id, the cluster (the ``cluster_id`` of its
``cluster`` record, created once) and the data dir (a random ``dir_id``
chosen when the cookie is stamped).  The rule (``judge``, pure), before any
port serves:

=========  ==========  ==================  ===================================
data dir   etcd        cluster record      verdict
=========  ==========  ==================  ===================================
none       none        any                 STAMP: a new bookie, or one from
                                           before cookies; the file first,
                                           then etcd (create-if-absent)
none       released    -                   STAMP over it (a CAS): the id taken
                                           again, a rejoin (below)
none       a cookie    -                   LOST: the data dir lost its data
                                           (or is the wrong one): refused, or
                                           with ``--on-lost-disk rejoin``
                                           released once the id is free
a cookie   none        the cookie's        STAMP_ETCD: a first start cut off
                                           between the two writes, or the key
                                           deleted while the data was kept
a cookie   none        none or another     REFUSE: another or a rebuilt etcd
a cookie   released    the cookie's        REFUSE: the id's data was moved
                                           elsewhere; this dir is stale (but
                                           STAMP_ETCD over the mark where the
                                           file was stamped over that very
                                           mark: its rejoined_at is at or
                                           above the mark's revision)
a cookie   a cookie    the cookies'        OK when the two are the same
                                           (bookie id, cluster, data dir)
a cookie   a cookie    none or another     REFUSE
=========  ==========  ==================  ===================================

and a data dir whose cookie names another bookie id is refused in any row.
The file is written before the key, so no crash leaves the key without
the file (the one row that refuses for good).

A refused bookie exits with the reason.  Where its data was lost, the way
back is ``bookstream recover BOOKIE`` (or autorecovery) until no ledger
names it, then ``bookstream bookies cookie delete BOOKIE``, which *releases*
the id: etcd's cookie is replaced by one naming no data dir (``release``),
and the next start under the id stamps over it as a new bookie with an
empty disk.  (``--force`` releases the id of a bookie ledgers still name:
their entries on it are then its replicas in name only, until
autorecovery's full check finds it damaged.)  ``decommission`` releases
the id too.

With ``--on-lost-disk rejoin`` the bookie walks that way itself: it waits,
unregistered and serving nothing (so autorecovery, which sees it lost,
re-replicates what it held), until its id is *free* (``holds_id``: no
bookie registered under it, no ledger's fragment naming it, read at the
revision of the cookie's read), then releases it if etcd's cookie is
unchanged since (a CAS on its mod revision) and starts as a new bookie.  A
ledger created after that read cannot name it: placement chooses
registered bookies only.  (tla/BookstreamRejoin.tla: a rejoin while a
ledger names the id, mutant ``rejoin_while_named``, lets a recovery take
its empty answers for the truth and close before an acknowledged entry.)

A cookie stamped over a released one keeps the revision of the read that
saw it released (``rejoined_at``): a ledger below it may have a writer cut
off since (a zombie) whose ensemble still names the id and whose fence
here went with the disk, so those ledgers take no normal add here
(bookie/core.py, the rule's reason).  Only a reused id pays that: a new
bookie under a new id takes every ledger's adds, old streams' rolls
included.  (BookKeeper's data-integrity check keeps such a bookie in its
ensembles and copies its entries back to it, its ledgers fenced and
answering "unknown" meanwhile; draining it is the rule this module
already has, with autorecovery doing the copies.)

The ledger GC compares the two again before deleting anything
(``CookieGuard``): the listing is read at a revision where the cookie is
there and the same, and each candidate's absence in one read with it.

An etcd restored from a snapshot is the cluster's, cookie and all, but
has lost every change since.  The bookie notes what it read and wrote
there: the highest revision it read (``SEEN_FILE``: below it, etcd went
back in time, and new ledgers would take ids it holds), and its mark
(``marks/<id>``), raised by its etcd check and noted once acknowledged
(``MARK_FILE``: a mark below the note shows a restore the revisions do
not, with ``--bump-revision``).  Its start, its etcd check and its GC
passes compare them; a finding halts it (``halt``): read-only for good,
its GCs deleting nothing, the finding recorded (``HALT_FILE``) so that no
later start serves until an operator removes it.
"""
from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import logging
import time
import uuid
from pathlib import Path

from bookie.journal import write_durably
from bookstream_pb import metadata_pb2 as mpb
from metadata.errors import BadVersion, InvalidCookie, KeyExists, LostDiskNotDrained, MetadataError, decode_message
from metadata.layout import KeyLayout
from metadata.txn import Get

log = logging.getLogger(__name__)

COOKIE_FILE = "cookie"
COOKIE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Cookie:
    bookie_id: str
    cluster_id: str
    dir_id: str
    created_ms: int = 0
    # stamped over a released cookie (a rejoin): the revision of the read
    # that saw it released; ledgers below it take no normal add here (bookie/core.py)
    rejoined_at: int = 0

    @property
    def released(self) -> bool:
        """etcd's mark of an id released (``release``): no data dir holds it."""
        return not self.dir_id

    def same(self, other: "Cookie | None") -> bool:
        """The same bookie, cluster and data dir (when it was stamped is no part of who)."""
        return other is not None and (self.bookie_id, self.cluster_id, self.dir_id) == \
            (other.bookie_id, other.cluster_id, other.dir_id)

    def encode(self) -> bytes:
        return json.dumps({"version": COOKIE_VERSION, **dataclasses.asdict(self)}, sort_keys=True).encode() + b"\n"

    @staticmethod
    def decode(data: bytes, where: str, bookie_id: str) -> "Cookie":
        try:
            d = json.loads(data)
            if d.get("version") != COOKIE_VERSION:
                raise ValueError(f"version {d.get('version')!r}")
            return Cookie(str(d["bookie_id"]), str(d["cluster_id"]), str(d["dir_id"]), int(d.get("created_ms", 0)),
                          int(d.get("rejoined_at", 0)))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise InvalidCookie(bookie_id, f"bookie {bookie_id!r}: the cookie in {where} is unreadable ({e}); "
                                           "look at it before doing anything else") from None


class Verdict(enum.Enum):
    OK = "ok"
    STAMP = "stamp"              # write the file, then the key
    STAMP_ETCD = "stamp-etcd"    # write the key (the file is there)
    LOST = "lost"                # the data dir lost its data: refuse, or rejoin once the id is free
    REFUSE = "refuse"


def judge(local: Cookie | None, remote: Cookie | None, cluster_id: str | None,
          bookie_id: str, remote_rev: int = 0) -> tuple[Verdict, str]:
    """The verdict on a start of bookie ``bookie_id``, and why when REFUSE
    (see the module's table): ``local`` the data dir's cookie, ``remote``
    etcd's for ``bookie_id`` (written at ``remote_rev``), ``cluster_id``
    the cluster record's."""
    if local is not None and local.bookie_id != bookie_id:
        return Verdict.REFUSE, (f"the data dir's cookie names bookie {local.bookie_id!r}, not {bookie_id!r}: "
                                "this is another bookie's data dir")
    if local is None and (remote is None or remote.released):
        return Verdict.STAMP, ""
    if local is None:
        return Verdict.LOST, (
            f"etcd has a cookie for bookie {bookie_id!r} (stamped {_when(remote)}) but its data dir has none "
            "(or a cookie file and no data): "
            "the data dir lost its data, or is not this bookie's. A bookie that lost what it acknowledged must "
            "not serve under its old id (a recovery would take its empty answers as proof that acknowledged "
            f"entries were never written). Start it with a new id; or run `bookstream recover {bookie_id}` "
            f"until no ledger names it, then `bookstream bookies cookie delete {bookie_id}` (which releases the id); "
            "or start it with `--on-lost-disk rejoin`, which waits for that itself")
    if local.cluster_id != cluster_id:
        etcd_has = f"cluster id {cluster_id}" if cluster_id else "no cluster record"
        return Verdict.REFUSE, (
            f"the data dir's cookie belongs to cluster id {local.cluster_id}, and this etcd has {etcd_has}: "
            "another cluster's etcd, or one rebuilt from nothing (the ledgers this bookie holds are not "
            "listed there; its ledger GC would delete them). Point the bookie at its own cluster's etcd")
    if remote is None:
        return Verdict.STAMP_ETCD, ""
    if remote.released:
        if local.rejoined_at >= remote_rev > 0:   # stamped over this mark, cut off before the key's CAS
            return Verdict.STAMP_ETCD, ""
        return Verdict.REFUSE, (
            f"etcd marks bookie {bookie_id!r}'s id released ({_when(remote)}): its ledgers were moved to other "
            "bookies, and this data dir's are stale. Empty the data dir to start as a new bookie under the id")
    if not local.same(remote):
        return Verdict.REFUSE, (
            f"the data dir's cookie (cluster {local.cluster_id}, dir {local.dir_id}, stamped {_when(local)}) "
            f"is not etcd's for bookie {bookie_id!r} (cluster {remote.cluster_id}, dir {remote.dir_id}, "
            f"stamped {_when(remote)}): another data dir holds this id")
    return Verdict.OK, ""


def _when(c: Cookie) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(c.created_ms / 1000)) if c.created_ms else "?"


# -- the data dir's file ------------------------------------------------------------------

def read_local(data_dir: Path, bookie_id: str) -> Cookie | None:
    path = Path(data_dir) / COOKIE_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return Cookie.decode(data, str(path), bookie_id)


def write_local(data_dir: Path, cookie: Cookie) -> None:
    """Durably: the file and its directory entry fsynced before etcd's key is written."""
    write_durably(Path(data_dir) / COOKIE_FILE, cookie.encode())


# -- etcd's key ---------------------------------------------------------------------------

def _read_etcd(store, layout: KeyLayout, bookie_id: str, extra: list[Get] = ()):
    """(cluster id or None, etcd's cookie or None, its key's mod revision
    (0: none), the pages of ``extra``, revision): one read."""
    pages, rev = store.read([Get(layout.cluster_key()), Get(layout.cookie_key(bookie_id)), *extra])
    cluster_id = None
    if pages[0].items:
        cluster_id = decode_message(mpb.ClusterInfo, pages[0].items[0][1].value).cluster_id
    remote, remote_rev = None, 0
    if pages[1].items:
        v = pages[1].items[0][1]
        remote = Cookie.decode(v.value, "etcd (" + layout.cookie_key(bookie_id) + ")", bookie_id)
        remote_rev = v.mod_revision
    return cluster_id, remote, remote_rev, pages[2:], rev


def read_etcd(store, cluster: str, bookie_id: str) -> Cookie | None:
    return _read_etcd(store, KeyLayout(cluster), bookie_id)[1]


def holds_id(store, cluster: str, bookie_id: str, revision: int | None = None) -> tuple[bool, list[int]]:
    """What still needs ``bookie_id``'s old disk: whether a bookie is
    registered under it, and the ledgers a fragment of which names it
    (``LedgerStore.naming``, at ``revision``).  Its id is free when neither."""
    from metadata.ledgers import LedgerStore
    from metadata.registration import BookieRegistry

    registered = any(r.bookie_id == bookie_id for r in BookieRegistry(store, cluster).list_bookies())
    return registered, LedgerStore(store, cluster).naming(bookie_id, revision)


SEEN_FILE = "etcd.revision"   # the highest revision of etcd the bookie has read (its start, its ledger GC)
MARK_FILE = "etcd.mark"       # the last mark the bookie wrote to etcd and saw acknowledged (``CookieGuard.mark``)
HALT_FILE = "halted"          # why the bookie stopped trusting its etcd (``halt``): its starts refused until removed


def _noted(data_dir: Path | None, name: str) -> int:
    """The number noted in the data dir's file ``name`` (0: none)."""
    if data_dir is None:
        return 0
    path = Path(data_dir) / name
    try:
        return int(path.read_text().strip() or 0)
    except FileNotFoundError:
        return 0
    except (ValueError, UnicodeDecodeError) as e:   # (written by rename: the disk lied)
        log.warning("%s is unreadable (%s): nothing noted, etcd's going back unchecked until the next note", path, e)
        return 0


def seen_revision(data_dir: Path | None) -> int:
    """The highest etcd revision this data dir's bookie has noted (0: none)."""
    return _noted(data_dir, SEEN_FILE)


def noted_mark(data_dir: Path | None) -> int:
    """The last mark this data dir's bookie wrote to etcd and saw acknowledged (0: none)."""
    return _noted(data_dir, MARK_FILE)


def check_mark(bookie_id: str, etcd_mark: int, noted: int) -> None:
    """Raises ``InvalidCookie`` when etcd's mark of the bookie is below the
    one the bookie wrote there and saw acknowledged (``noted_mark``): etcd
    lost writes, restored from a snapshot taken before that write, with or
    without ``--bump-revision`` (the revision check sees only the latter,
    and only while etcd's revision has not grown past the bookie's note)."""
    if etcd_mark < noted:
        raise InvalidCookie(bookie_id, (
            f"etcd's mark of bookie {bookie_id!r} is {etcd_mark}, below {noted}, which the bookie wrote there and "
            "saw acknowledged: etcd lost acknowledged writes, restored from a snapshot taken before (with or "
            "without --bump-revision). Every metadata change since the snapshot is lost: ledgers created since "
            "(the GCs would delete their entries), fragments added since (a recovery would not read their "
            "entries), closes and trims. Check the metadata against the bookies (README: restoring etcd)"))


def note_revision(data_dir: Path | None, revision: int) -> None:
    """Records ``revision`` as seen, if above what was (durably: a restart's
    check rests on it)."""
    if data_dir is not None and revision > seen_revision(data_dir):
        write_durably(Path(data_dir) / SEEN_FILE, f"{revision}\n".encode())


def halted(data_dir: Path | None) -> str | None:
    """Why this data dir's bookie stopped trusting its etcd (``halt``), or None."""
    if data_dir is None:
        return None
    try:
        return (Path(data_dir) / HALT_FILE).read_text(errors="replace").strip() or "(no reason recorded)"
    except FileNotFoundError:
        return None


def halt(core, data_dir: Path | None, finding: InvalidCookie) -> None:
    """The one reaction to etcd found untrustworthy while the bookie runs
    (its etcd check, a GC pass): read-only for good
    (``BookieCore.halt``: no normal add, no prepare, nothing its GCs
    delete), and the finding written to the data dir (``HALT_FILE``), so
    that no later start serves on that etcd either, whatever its revision
    has grown to by then (an etcd restored without ``--bump-revision``
    soon passes the revisions the bookie noted: the ids it reuses are
    still this bookie's ledgers).  An operator removes the file once etcd
    is one the bookie's data answers to (README: restoring etcd)."""
    if core.halt(str(finding)):
        _record_halt(data_dir, finding)   # (first: the log line says it is recorded)
        log.error("read-only for good, until an operator looks: %s", finding)


def _record_halt(data_dir: Path | None, finding: InvalidCookie) -> None:
    if data_dir is not None and halted(data_dir) is None:
        try:
            write_durably(Path(data_dir) / HALT_FILE, f"{finding}\n".encode())
        except OSError as e:   # (the halt holds in memory; a start's own check may still refuse)
            log.error("could not record the halt in %s: %s", Path(data_dir) / HALT_FILE, e)


def check_revision(bookie_id: str, revision: int, seen: int) -> None:
    """Raises ``InvalidCookie`` when etcd's ``revision`` is below ``seen``,
    one this bookie read from etcd before (``seen_revision``; a rejoin's):
    etcd went back in time, restored from a snapshot without
    ``--bump-revision``.  New ledgers would take ids (revisions) this
    bookie may hold state for (terms, fences, entries), and its ledger GC
    would delete the ledgers created since the snapshot, which the restored
    etcd no longer lists.  (Noted from etcd's own answers, not from ledger
    ids: a client may send any ledger id.)"""
    if revision < seen:
        raise InvalidCookie(bookie_id, (
            f"etcd's revision {revision} is below {seen}, which bookie {bookie_id!r} read from it before: etcd "
            "went back in time, restored from a snapshot without --bump-revision. New ledgers would reuse ids "
            "this bookie may hold, and its ledger GC would delete the ledgers created since the snapshot. Restore "
            "again with `etcdutl snapshot restore ... --bump-revision N --mark-compacted` (README: restoring "
            "etcd)"))


def verify(store, cluster: str, data_dir: Path, bookie_id: str, rejoin: bool = False,
           data_present: bool = True) -> Cookie:
    """Judges the start of ``bookie_id`` on ``data_dir`` and stamps what the
    verdict says; returns the cookie both now hold, or raises
    ``InvalidCookie``.  ``rejoin`` (``--on-lost-disk rejoin``): a data dir
    that lost its data is stamped anew once its id is free, and
    ``LostDiskNotDrained`` says what holds it until then (the caller waits
    and asks again).  ``data_present``: whether the data dir held a journal
    or a checkpoint before this start (``Storage.had_history``); a cookie
    file without them is judged as no cookie (the data lost).  etcd's
    revision below one the bookie noted before is refused
    (``check_revision``), and so is etcd's mark of the bookie below the
    one it noted (``check_mark``): both recorded as a halt (``HALT_FILE``:
    refused until an operator removes it); the revision read is noted once
    the start is judged good.  Raises the metadata's errors (etcd unavailable)."""
    from metadata.cluster import init_cluster

    why = halted(data_dir)
    if why is not None:
        raise InvalidCookie(bookie_id, (
            f"bookie {bookie_id!r} refuses to start: it stopped trusting its etcd ({why}). "
            f"Once etcd is one its data answers to (its own cluster's; restored with --bump-revision where it "
            f"came from a snapshot, README: restoring etcd), remove {Path(data_dir) / HALT_FILE}"))
    layout = KeyLayout(cluster)
    local = read_local(data_dir, bookie_id)
    if local is not None and not data_present:   # (its journal and checkpoint gone, the cookie file kept)
        log.warning("bookie %s: the data dir keeps its cookie file but no journal and no checkpoint: judged as "
                    "a data dir that lost its data", bookie_id)
        local = None
    for _ in range(4):   # (a KeyExists or a changed cookie below: judged again on what won)
        cluster_id, remote, remote_rev, (mark,), rev = _read_etcd(store, layout, bookie_id,
                                                                  [Get(layout.mark_key(bookie_id))])
        try:
            check_revision(bookie_id, rev, max(seen_revision(data_dir), local.rejoined_at if local is not None else 0))
            check_mark(bookie_id, _mark_of(mark)[0], noted_mark(data_dir))
        except InvalidCookie as e:   # (recorded: a later start, on etcd's grown revision, is refused too)
            _record_halt(data_dir, e)
            raise
        verdict, why = judge(local, remote, cluster_id, bookie_id, remote_rev)
        if verdict is Verdict.OK:
            note_revision(data_dir, rev)
            return local
        if verdict is Verdict.REFUSE or (verdict is Verdict.LOST and not rejoin):
            raise InvalidCookie(bookie_id, f"bookie {bookie_id!r} refuses to start: {why}")
        if verdict is Verdict.LOST:
            registered, named = holds_id(store, cluster, bookie_id, rev)
            if registered or named:
                raise LostDiskNotDrained(bookie_id, registered, named)
            _release(store, layout, remote, remote_rev)   # (False: it changed; judged again)
            continue
        over = remote_rev if remote is not None and remote.released else 0
        if verdict is Verdict.STAMP:
            info = init_cluster(store, cluster)
            local = Cookie(bookie_id, info.cluster_id, uuid.uuid4().hex, int(time.time() * 1000),
                           rev if over else 0)
            write_local(data_dir, local)
        try:
            if over:
                store.cas(layout.cookie_key(bookie_id), local.encode(), over)
            else:
                store.create(layout.cookie_key(bookie_id), local.encode())
            note_revision(data_dir, rev)
            return local
        except (KeyExists, BadVersion):
            continue
    raise InvalidCookie(bookie_id, f"bookie {bookie_id!r}: its cookie in etcd keeps changing under it")


def _mark_of(page) -> tuple[int, int]:
    """(etcd's mark of the bookie, its key's mod revision), (0, 0) when absent."""
    if not page.items:
        return 0, 0
    v = page.items[0][1]
    try:
        return int(v.value.decode() or 0), v.mod_revision
    except (ValueError, UnicodeDecodeError):
        return 0, v.mod_revision   # (rewritten by the next mark)


@dataclasses.dataclass
class CookieGuard:
    """A running bookie's checks that etcd is still the one its cookie
    names and has lost nothing the bookie saw it acknowledge (its etcd
    check, its GC passes, bookie/ledger_gc.py): a read of etcd's cookie,
    the cluster record and the bookie's mark beside each read a deletion
    rests on; and the mark, which the etcd check raises (``mark``)."""

    store: object
    cluster: str
    cookie: Cookie
    data_dir: Path | None = None   # where the revisions read and the marks written are noted
    _mark: tuple[int, int] = (0, 0)   # etcd's mark and its mod revision, as the last check read them

    def _check(self, cluster_id: str | None, remote: Cookie | None) -> None:
        if self.cookie.cluster_id != cluster_id or not self.cookie.same(remote):
            raise InvalidCookie(self.cookie.bookie_id, (
                f"etcd no longer holds bookie {self.cookie.bookie_id!r}'s cookie as its data dir does "
                f"(cluster record {cluster_id or 'absent'}, cookie {'absent' if remote is None else 'different'}): "
                "nothing deleted"))

    def revision(self) -> int:
        """A revision at which etcd's cookie is the bookie's, not below one
        the bookie read before (``check_revision``), its mark not below the
        bookie's note (``check_mark``); the revision noted (raises
        ``InvalidCookie``)."""
        layout, bid = KeyLayout(self.cluster), self.cookie.bookie_id
        cluster_id, remote, _, (mark,), rev = _read_etcd(self.store, layout, bid, [Get(layout.mark_key(bid))])
        self._check(cluster_id, remote)
        check_revision(bid, rev, seen_revision(self.data_dir))
        self._mark = _mark_of(mark)
        check_mark(bid, self._mark[0], noted_mark(self.data_dir))
        note_revision(self.data_dir, rev)
        return rev

    def mark(self) -> int | None:
        """After a ``revision`` that passed: etcd's mark raised by one (a
        compare-and-swap on what that read), then noted in the data dir,
        durably, once etcd acknowledged it (noted first, a crash before the
        write would leave the note above etcd's mark: a false alarm).  A
        snapshot taken before this write and restored later holds a mark
        below the note.  Returns the new mark, or None (the key changed
        since the read: tried again next check)."""
        layout, bid = KeyLayout(self.cluster), self.cookie.bookie_id
        value, mod = self._mark
        nxt = max(value, noted_mark(self.data_dir)) + 1
        try:
            if mod:
                mod = self.store.cas(layout.mark_key(bid), str(nxt).encode(), mod)
            else:
                mod = self.store.create(layout.mark_key(bid), str(nxt).encode())
        except (KeyExists, BadVersion):
            return None
        write_durably(Path(self.data_dir) / MARK_FILE, f"{nxt}\n".encode())
        self._mark = (nxt, mod)
        return nxt

    def absent(self, key: str) -> bool:
        """Whether ``key`` is absent, read with the cookie (raises ``InvalidCookie``)."""
        cluster_id, remote, _, (page,), _ = _read_etcd(self.store, KeyLayout(self.cluster), self.cookie.bookie_id,
                                                    [Get(key)])
        self._check(cluster_id, remote)
        return not page.items


async def etcd_check_loop(storage, registration, cookie: Cookie, interval: float) -> None:
    """A running bookie's etcd check (``--etcd-check-interval``), every
    ``interval`` seconds: etcd still the one the cookie names, its revision
    not below one read before (noted), the bookie's mark in etcd not below
    the last it wrote (then raised: ``CookieGuard.mark``).  Else ``halt``:
    read-only for good, recorded in the data dir (the registration follows
    with the bookie's disk check).  An etcd that does not answer is asked
    again next time."""
    guard = CookieGuard(registration.store, registration.cluster, cookie, storage.dir)
    while True:
        await asyncio.sleep(interval)
        try:
            await asyncio.to_thread(guard.revision)
            await asyncio.to_thread(guard.mark)
        except InvalidCookie as e:
            halt(storage.core, storage.dir, e)
        except MetadataError:
            pass
        except Exception:
            log.exception("etcd check failed")


def _release(store, layout: KeyLayout, remote: Cookie, mod_revision: int) -> bool:
    """etcd's cookie ``remote`` replaced by a released one, if its key is at
    ``mod_revision``; whether it was."""
    marked = Cookie(remote.bookie_id, remote.cluster_id, "", int(time.time() * 1000))
    try:
        store.cas(layout.cookie_key(remote.bookie_id), marked.encode(), mod_revision)
        return True
    except BadVersion:
        return False


def release(store, cluster: str, bookie_id: str) -> bool:
    """Releases ``bookie_id``'s id (the caller checked that nothing needs
    its data dir): its next start stamps a new cookie over the mark, as a
    rejoin.  Whether there was a cookie (a released one stays released)."""
    layout = KeyLayout(cluster)
    for _ in range(3):
        _, remote, remote_rev, _, _ = _read_etcd(store, layout, bookie_id)
        if remote is None:
            return False
        if remote.released or _release(store, layout, remote, remote_rev):
            return True
    raise InvalidCookie(bookie_id, f"bookie {bookie_id!r}: its cookie in etcd keeps changing under it")


__all__ = ["COOKIE_FILE", "Cookie", "CookieGuard", "Verdict", "holds_id", "judge", "read_etcd", "read_local",
           "release", "verify", "write_local"]
