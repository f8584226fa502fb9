"""docs/output.md's field tables are the records' dataclasses: a field added, renamed or redefined in
code without its table (``python -m tests.docs_tables`` regenerates them) fails here."""

from __future__ import annotations

import dataclasses

import pytest

from tests import docs_tables
from tests.every_record import read_records


@pytest.mark.parametrize("name", sorted(docs_tables.TABLES))
def test_the_docs_table_equals_the_dataclass(name: str) -> None:
    table = docs_tables.found(name)
    assert table is not None, f"{docs_tables.TABLES[name][1]} lacks the <!-- fields: {name} --> table"
    assert table == docs_tables.expected(name), f"regenerate with: python -m tests.docs_tables ({name})"


def test_every_field_of_a_record_says_what_it_holds() -> None:
    from cosyclone.base.fieldtable import field_docs

    for cls, _ in docs_tables.TABLES.values():
        docs = field_docs(cls)  # raises on a field without its comment
        assert sorted(d.name for d in docs) == sorted(f.name for f in dataclasses.fields(cls))


def test_a_text_holding_a_line_separator_keeps_its_record(tmp_path) -> None:
    """U+2028 and U+2029 are valid in a manifest text and written raw (ensure_ascii=False); the folder's
    reader splits lines at \\n only, so such a row's record reads back (it used to be redone forever)."""
    from cosyclone.engine import RowResult
    from cosyclone.folder import layout as runfolder
    from cosyclone.folder.row_record import RowStamp
    from cosyclone.folder.settle import settle
    from cosyclone.folder.writer import BackgroundWriter, WriterOptions

    text = "first line\u2028second\u2029third"
    stamp = RowStamp(
        fingerprint="f",
        fingerprint_parts={},
        run_id="r",
        text=text,
        prompt_text="",
        prompt_audio="p",
        mode="cross_lingual",
        instruct="",
        speed=1.0,
        manifest="m",
        shard=None,
    )
    writer = BackgroundWriter(WriterOptions(out_dir=tmp_path), runfolder.journal_path(tmp_path, "all"))
    writer.submit(RowResult(id="sep", line=1, seed=0, status="failed", error="x"), stamp)
    writer.close()
    assert read_records(tmp_path)["sep"].text == text
    settle(tmp_path, "all")
    assert read_records(tmp_path)["sep"].text == text  # and once appended to diagnostics.jsonl
