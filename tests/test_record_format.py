"""The entry record layout changed (issue 12: the origin term, 60-byte
header): a bookie's data dir says which layout it holds, and a bookie
refuses one of another layout instead of cutting its journal as torn."""
from __future__ import annotations

import pytest

from bookie import entry as E
from bookie.storage import Storage, StorageFormatError


def test_a_new_data_dir_records_its_format_and_opens_again(tmp_path):
    s = Storage(tmp_path / "d")
    s.open()
    assert (tmp_path / "d" / "FORMAT").read_text().strip() == E.RECORD_FORMAT
    s.close()
    Storage(tmp_path / "d").open()


def test_a_data_dir_of_the_earlier_layout_is_refused_untouched(tmp_path):
    s = Storage(tmp_path / "d")
    s.open()
    s.close()
    (tmp_path / "d" / "FORMAT").unlink()  # as an earlier bookie left it: journal segments, no FORMAT
    segs = {p.name: p.read_bytes() for p in (tmp_path / "d" / "journal").iterdir()}
    assert segs
    with pytest.raises(StorageFormatError, match="earlier bookie"):
        Storage(tmp_path / "d").open()
    assert {p.name: p.read_bytes() for p in (tmp_path / "d" / "journal").iterdir()} == segs
    (tmp_path / "d" / "FORMAT").write_text("bookstream entry records v1\n")
    with pytest.raises(StorageFormatError, match="v1"):
        Storage(tmp_path / "d").open()
