"""``cosyclone report``: the folders' totals, and with ``--html`` one self-contained page of the night.

The page (:func:`write_html_report`) holds the totals, the run history, plots of every row's
figures, the rows far outside the folder's spread (with a redo manifest) and the rows to listen
to, their audio inside it. Modules, one concern each: figures (the per-row columns), outliers,
listing (which rows to hear), plots, audio (the players' sources), history (runs.jsonl), page
(the HTML), build (the whole), command (the CLI command).
"""

from cosyclone.report.build import HtmlReport, write_html_report

__all__ = ["HtmlReport", "write_html_report"]
