"""docs/output.md's field tables are the records' dataclasses: a field added, renamed or redefined in
code without its table (``python -m tests.docs_tables`` regenerates them) fails here."""

from __future__ import annotations

import pytest

from tests import docs_tables


@pytest.mark.parametrize("name", sorted(docs_tables.TABLES))
def test_the_docs_table_equals_the_dataclass(name: str) -> None:
    table = docs_tables.found(name)
    assert table is not None, f"{docs_tables.TABLES[name][1]} lacks the <!-- fields: {name} --> table"
    assert table == docs_tables.expected(name), f"regenerate with: python -m tests.docs_tables ({name})"


def test_every_field_of_a_record_says_what_it_holds() -> None:
    from cosyclone.base.fieldtable import field_docs

    for cls, _ in docs_tables.TABLES.values():
        docs = field_docs(cls)  # raises on a field without its comment
        assert sorted(d.name for d in docs) == sorted(cls.__dataclass_fields__)
