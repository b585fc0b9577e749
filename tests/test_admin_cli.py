"""The admin CLI (issue 17): every command's table and JSON output, its exit
codes and one-line errors, against a real cluster (real etcd, four real
bookie processes).  Commands run in-process through click's runner, as a
script would call them (stdout not a terminal); the exit codes a shell sees
and the wrong-address timing run the real `bookstream` in a subprocess."""
from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from bookstream.admin import EXIT_NOT_FOUND, EXIT_UNAVAILABLE, EXIT_USAGE, cli


@pytest.fixture(scope="module")
def env(shared):
    return {"BOOKSTREAM_ETCD": shared.endpoint, "BOOKSTREAM_CLUSTER": shared.cluster}


def bs(env, *args, code: int = 0):
    """Runs `bookstream ARGS`; checks the exit code; returns the result."""
    r = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    assert r.exit_code == code, f"bookstream {' '.join(args)} -> {r.exit_code}\n{r.stdout}\n{r.stderr}"
    return r


def js(env, *args):
    return json.loads(bs(env, *args, "--format", "json").stdout)


def one_line_error(r, fmt: str = "table") -> dict | str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    if fmt == "json":
        return json.loads(lines[0])["error"]
    assert lines[0].startswith("error: ")
    return lines[0]


# -- bookies ---------------------------------------------------------------------------------


def test_bookies_list_info_and_sanity(env, shared):
    ids = sorted(b.bookie_id for b in shared.bookies)
    rows = js(env, "bookies", "list")
    assert [r["bookie_id"] for r in rows] == ids and {r["state"] for r in rows} == {"writable"}
    assert {r["address"] for r in rows} == {b.address for b in shared.bookies}
    assert {r["read_address"] for r in rows} == {b.read_address for b in shared.bookies} and all(
        r["read_address"] for r in rows)   # (bookie/read_port.py)
    assert [r["bookie_id"] for r in js(env, "bookies", "list", "--writable")] == ids
    assert js(env, "bookies", "list", "--readonly") == []
    table = bs(env, "bookies", "list").stdout
    assert all(i in table for i in ids) and "writable" in table and "address" in table

    b = shared.bookies[0]
    info = js(env, "bookies", "info", b.bookie_id)
    assert info["bookie_id"] == b.bookie_id and info["address"] == b.address and info["registered"]
    assert info["registration_state"] == "held" and info["state"] == "writable" and info["total_bytes"] > 0
    by_address = js(env, "bookies", "info", b.address)
    assert by_address["bookie_id"] == b.bookie_id
    table = bs(env, "bookies", "info", b.bookie_id).stdout
    assert "registration_state" in table and "held" in table and "journal_fsyncs" in table

    ok = js(env, "bookies", "sanity", b.bookie_id)
    assert ok["ok"] is True and ok["bookie_id"] == b.bookie_id and ok["ledger_entries"] == 10
    assert "True" in bs(env, "bookies", "sanity", shared.bookies[1].address, "--entries", "3").stdout
    assert not any(r["custom"].get("sanity") for r in js(env, "ledgers", "list"))  # cleaned up


def test_unknown_bookie_is_one_line_with_exit_code_3(env):
    r = bs(env, "bookies", "info", "no-such-bookie", code=EXIT_NOT_FOUND)
    assert "no bookie 'no-such-bookie'" in one_line_error(r)
    r = bs(env, "bookies", "sanity", "no-such-bookie", "--format", "json", code=EXIT_NOT_FOUND)
    err = one_line_error(r, "json")
    assert err["type"] == "NotFound" and err["exit_code"] == 3 and err["retriable"] is False


# -- streams ---------------------------------------------------------------------------------


PAYLOADS = [b"rec-%d" % i for i in range(40)] + [b"bin\n\x00\x1b[31m"]


@pytest.fixture(scope="module")
def stream(shared):
    from stream.stream import StreamClient, StreamConfig

    with StreamClient(shared.endpoint, shared.cluster) as sc:
        with sc.open_writer("orders", StreamConfig(3, 3, 2, fragment_size_entries=15)) as w:
            positions = [w.append_async(p) for p in PAYLOADS]
            w.flush()
            positions = [f.result() for f in positions]
    return [str(p) for p in positions]


def test_streams_list_show_read(env, stream):
    rows = js(env, "streams", "list")
    row = next(r for r in rows if r["name"] == "orders")
    assert row["state"] == "OPEN" and row["term"] == 1 and (row["E"], row["Qw"], row["Qa"]) == (3, 3, 2)
    assert "orders" in bs(env, "streams", "list").stdout

    show = js(env, "streams", "show", "orders")
    assert show["lac"] == int(stream[-1]) and show["term"] == 1 and show["fragment_count"] >= 3
    assert show["writer"] == {"state": "none"}   # its writer closed: its registration went
    frags = show["fragments"]
    assert frags[0]["first_entry"] == 0 and frags[-1]["last_entry"] == show["lac"]
    assert all(a["last_entry"] + 1 == b["first_entry"] for a, b in zip(frags, frags[1:]))
    assert all(len(f["ensemble"]) == 3 for f in frags)
    table = bs(env, "streams", "show", "orders").stdout
    assert "fragments" in table and "first entry" in table

    lines = [json.loads(x) for x in bs(env, "streams", "read", "orders", "--format", "json").stdout.splitlines()]
    assert [x["position"] for x in lines] == stream
    assert [bytes.fromhex(x["payload_hex"]) for x in lines] == PAYLOADS
    assert lines[-1]["payload"] == "bin\\n\\x00\\x1b[31m"           # escaped, terminal-safe
    some = bs(env, "streams", "read", "orders", "--from", stream[5], "--count", "2").stdout.splitlines()
    assert some == [f"{stream[5]}\t5\trec-5", f"{stream[6]}\t5\trec-6"]
    last = bs(env, "streams", "read", "orders", "--from", stream[-1]).stdout
    assert "\x1b" not in last and "\\x1b[31m" in last
    raw = CliRunner().invoke(cli, ["streams", "read", "orders", "--from", stream[-1], "--raw"], env=env)
    assert raw.exit_code == 0 and raw.stdout_bytes == PAYLOADS[-1]
    hexed = bs(env, "streams", "read", "orders", "--from", stream[0], "--count", "1", "--hex").stdout
    assert PAYLOADS[0].hex() in hexed
    # tail from a position: prints what is there, then what comes (here: stops at --count)
    tailed = bs(env, "streams", "tail", "orders", "--from", stream[1], "--count", "2", "--format", "json").stdout
    assert [json.loads(x)["position"] for x in tailed.splitlines()] == stream[1:3]


def test_streams_show_the_writer_and_its_lease(env, shared):
    from stream.stream import StreamClient, StreamConfig

    with StreamClient(shared.endpoint, shared.cluster, writer_lease_ttl=7) as sc:
        with sc.open_writer("leased", StreamConfig(3, 3, 2)) as w:
            w.append(b"x")
            lease = w.aio.registration.keeper.lease.id
            show = js(env, "streams", "show", "leased")
            wr = show["writer"]
            assert wr["state"] == "live" and wr["term"] == show["term"] == w.term
            assert wr["id"] == w.aio.registration.record.writer_id and wr["pid"] > 0 and wr["host"]
            assert wr["lease"] == f"{lease:#x}" and 0 < wr["lease_ttl"] <= 7 and wr["started"].endswith("+00:00")
            table = bs(env, "streams", "show", "leased").stdout
            assert "state=live" in table and f"lease={lease:#x}" in table and "lease_ttl=" in table
        assert js(env, "streams", "show", "leased")["writer"] == {"state": "none"}
        assert "state=none" in bs(env, "streams", "show", "leased").stdout


def test_streams_tail_follows_new_records(env, shared):
    from stream.stream import StreamClient

    with StreamClient(shared.endpoint, shared.cluster) as sc, sc.open_writer("tailed") as w:
        last = w.append(b"before")
    # from the next position on: whatever the timing, the tail waits for it
    tail = subprocess.Popen([sys.executable, "-m", "bookstream.cli", "streams", "tail", "tailed", "--from",
                             str(last.entry_id + 1), "--count", "2", "--format", "json",
                             "--etcd", shared.endpoint, "--cluster", shared.cluster],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with StreamClient(shared.endpoint, shared.cluster) as sc, sc.open_writer("tailed") as w:
            w.append(b"after-1")
            w.append(b"after-\x00")
        out, err = tail.communicate(timeout=60)
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait()
    assert tail.returncode == 0, err
    assert [bytes.fromhex(json.loads(x)["payload_hex"]) for x in out.splitlines()] == [b"after-1", b"after-\x00"]


def test_streams_trim_and_delete(env, shared):
    from stream.stream import StreamClient, StreamConfig

    with StreamClient(shared.endpoint, shared.cluster) as sc:
        with sc.open_writer("short", StreamConfig(3, 3, 2, fragment_size_entries=10)) as w:
            pos = [w.append(b"x%d" % i) for i in range(30)]
    trimmed = js(env, "streams", "trim", "short", "--before", str(pos[20]))
    assert trimmed["fragments_dropped"] >= 1 and trimmed["trimmed_before"] > 0
    assert "fragments_dropped" in bs(env, "streams", "trim", "short", "--before", str(pos[20])).stdout
    r = bs(env, "streams", "trim", "short", "--before", "not-a-position", code=EXIT_USAGE)
    assert "bad position" in one_line_error(r)
    r = bs(env, "streams", "delete", "short", code=EXIT_USAGE)   # not a terminal: needs --yes
    assert "--yes" in one_line_error(r)
    assert js(env, "streams", "delete", "short", "--yes")["deleted"] is True
    r = bs(env, "streams", "show", "short", "--format", "json", code=EXIT_NOT_FOUND)
    assert one_line_error(r, "json")["type"] == "NoSuchStream"
    r = bs(env, "streams", "read", "short", code=EXIT_NOT_FOUND)
    one_line_error(r)


# -- ledgers, logs, simpletest -------------------------------------------------------------------


def test_ledgers_list_show_read_delete(env, shared, stream):
    from stream.client import SyncBookKeeperClient

    with SyncBookKeeperClient(shared.endpoint, shared.cluster) as bk:
        lh = bk.create_ledger(3, 2, 2)
        for i in range(5):
            lh.add_entry(b"e%d" % i)
        lh.close()
        lid = lh.ledger_id
    rows = {r["ledger_id"]: r for r in js(env, "ledgers", "list")}
    assert rows[lid]["mode"] == "classic" and rows[lid]["state"] == "CLOSED" and rows[lid]["last_entry"] == 4
    stream_ledger = next(r for r in rows.values() if r["owner"] == "stream orders")
    assert stream_ledger["mode"] == "unbounded"
    assert str(lid) in bs(env, "ledgers", "list").stdout

    show = js(env, "ledgers", "show", str(lid))
    assert show["config"] == "3/2/2" and show["lac"] == 4 and show["fragments"][0]["last_entry"] == 4
    assert "fragments" in bs(env, "ledgers", "show", str(lid)).stdout

    entries = js(env, "ledgers", "read", str(lid), "--from", "1", "--to", "3")
    assert [(e["entry_id"], bytes.fromhex(e["payload_hex"])) for e in entries] == [(1, b"e1"), (2, b"e2"), (3, b"e3")]
    assert "e4" in bs(env, "ledgers", "read", str(lid)).stdout
    # a stream's ledger reads too (its no-op entry hidden unless asked)
    sl = str(stream_ledger["ledger_id"])
    assert [e["entry_id"] for e in js(env, "ledgers", "read", sl, "--to", "2")] == [1, 2]
    assert js(env, "ledgers", "read", sl, "--to", "0", "--noops")[0]["noop"] is True

    r = bs(env, "ledgers", "delete", sl, "--yes", code=EXIT_USAGE)     # a stream's: refused
    assert "streams delete orders" in one_line_error(r)
    assert js(env, "ledgers", "delete", str(lid), "--yes")["deleted"] is True
    r = bs(env, "ledgers", "show", str(lid), code=EXIT_NOT_FOUND)
    assert f"no such ledger: {lid}" in one_line_error(r)
    bs(env, "ledgers", "show", "abc", code=EXIT_USAGE)


def test_logs_list_and_show(env, shared):
    from stream import errors as se
    from stream.client import BookKeeperClient
    from stream.log import LogReader, LogWriter

    async def write():
        async with BookKeeperClient(shared.endpoint, shared.cluster) as bk:
            async with await LogWriter(bk, "audit", 3, 3, 2).open() as w:
                await w.append(b"one")
                await w.roll()
                await w.append(b"two")
                return w.ledger_ids
    ids = asyncio.run(write())
    row = next(r for r in js(env, "logs", "list") if r["name"] == "audit")
    assert row["ledger_ids"][:len(ids)] == ids
    assert "audit" in bs(env, "logs", "list").stdout
    show = js(env, "logs", "show", "audit")
    assert [x["ledger_id"] for x in show["ledgers"]][:len(ids)] == ids and show["entries"] >= 2
    assert "LAC" in bs(env, "logs", "show", "audit").stdout
    bs(env, "logs", "show", "no-such-log", code=EXIT_NOT_FOUND)
    # a ledger a log lists: its deletion refused (its readers would lose its entries), unless forced
    r = bs(env, "ledgers", "delete", str(ids[0]), "--yes", code=EXIT_USAGE)
    assert "log(s) 'audit'" in one_line_error(r)
    assert js(env, "ledgers", "delete", str(ids[0]), "--yes", "--force")["deleted"] is True

    async def read_back():
        async with BookKeeperClient(shared.endpoint, shared.cluster) as bk:
            return await LogReader(bk, "audit").read_all()
    with pytest.raises(se.NoSuchLedger, match=rf"names ledger\(s\) \[{ids[0]}\], which no longer exist"):
        asyncio.run(read_back())   # (not the log's other entries, silently without the first ledger's)


def test_simpletest(env):
    res = js(env, "simpletest", "--entries", "200", "--size", "100", "-e", "3", "-w", "2", "-a", "2")
    assert res["ok"] is True and res["entries"] == 200 and res["adds_per_second"] > 0
    assert len(res["ensemble_bookies"]) == 3 and res["add_latency_ms_p99"] >= res["add_latency_ms_p50"]
    assert "adds_per_second" in bs(env, "simpletest", "--entries", "20").stdout
    r = bs(env, "simpletest", "-e", "9", "--format", "json", code=5)  # 4 bookies: cannot place E9
    assert one_line_error(r, "json")["message"].startswith("simpletest failed")


# -- as a shell sees it ----------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_wrong_etcd_address_fails_within_seconds_with_exit_code_4():
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "bookstream.cli", "bookies", "list", "--etcd",
                        f"127.0.0.1:{_closed_port()}", "--timeout", "3"], capture_output=True, text=True, timeout=60)
    assert r.returncode == EXIT_UNAVAILABLE and time.monotonic() - t0 < 20   # python start-up included
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1 and "unreachable" in r.stderr
    r = subprocess.run([sys.executable, "-m", "bookstream.cli", "streams", "list", "--format", "json", "--etcd",
                        f"127.0.0.1:{_closed_port()}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == EXIT_UNAVAILABLE and json.loads(r.stderr)["error"]["retriable"] is True


def test_the_argparse_commands_still_answer():
    for cmd in (["bookie", "--help"], ["standalone", "--help"], ["bench", "--help"]):
        r = subprocess.run([sys.executable, "-m", "bookstream.cli", *cmd], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "usage: bookstream" in r.stdout, (cmd, r.stderr)
    r = subprocess.run([sys.executable, "-m", "bookstream.cli", "bookie"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--data-dir" in r.stderr


@pytest.mark.parametrize("option, value", [
    ("--disk-check-interval", "0"),        # (a loop with no sleep: a core burnt)
    ("--gc-interval", "-1"),
    ("--etcd-check-interval", "nan"),
    ("--segment-size", "4096"),            # (below the journal's 64 KiB)
    ("--max-entry-size", "0"),
    ("--disk-usage-threshold", "1.5"),
    ("--compaction-threshold", "-0.1"),
    ("--registration-ttl", "1"),
    ("--port", "70000"),
    ("--checkpoint-bytes", "lots"),
])
def test_a_bookie_refuses_a_bad_number_in_one_line(tmp_path, option, value):
    r = subprocess.run([sys.executable, "-m", "bookstream.cli", "bookie", "--data-dir", str(tmp_path / "b"),
                        option, value], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and f"argument {option}: must be" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_bookie_refuses_a_margin_at_or_above_its_threshold(tmp_path):
    """Read-only above the threshold, it would never be writable again."""
    r = subprocess.run([sys.executable, "-m", "bookstream.cli", "bookie", "--data-dir", str(tmp_path / "b"),
                        "--disk-usage-threshold", "0.5", "--disk-usage-margin", "0.5"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "must be below the threshold (0.5)" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("cmd", [
    ["standalone", "--bookies", "0"],
    ["standalone", "--etcd-port", "-1"],
    ["autorecovery", "run", "--check-interval", "0"],
    ["ledgers", "list", "--timeout", "0"],
])
def test_the_other_commands_refuse_a_bad_number(cmd):
    r = subprocess.run([sys.executable, "-m", "bookstream.cli", *cmd], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and cmd[-2] in r.stderr and "Traceback" not in r.stderr, r.stderr
