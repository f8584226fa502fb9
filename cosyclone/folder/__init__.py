"""The run folder as a store: its layout and paths, its records, its index, its writer and lock.

``layout`` is the folder as a dataset (record files, journal, audio paths, fsync discipline),
``row_record`` a row's record line, ``index`` the SQLite index (where each row's current record lies,
the kept totals), ``writer`` writes audio and records, ``settle`` ends a run (its journal appended, its
metadata written), ``lock`` keeps one writer per folder, ``token_store`` the stage-0 checkpoint,
``fingerprint`` what a row's inputs hash to, ``totals`` reads the kept totals, ``scores`` names eval's
files, ``columns`` the one column table of ``metadata.jsonl`` and the exports.
Imports run one way: the run, Ray, export and the features use this package; it uses the engine's
typed results and nothing above them.
"""
