"""What ``cosyclone report`` prints and writes, declared in the option registry.

Like a run's options (:mod:`cosyclone.options`): one field per option with its flag, help line and
panel, so ``--help``, docs/cli.md and the bounds check read one table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cosyclone.options import OUTPUT, REPORT, check, opt


@dataclass(frozen=True)
class ReportOptions:
    """What ``cosyclone report`` prints (a table or JSON) and writes beside it: the folders' one HTML page."""

    # write the folders' page here (totals, run history, plots, the rows to listen to, outliers): outside
    # every run folder, in a folder that exists, over no file but a page report wrote (report/target.py)
    html: Path | None = opt(None, "write one self-contained HTML page here", panel=OUTPUT, metavar="PAGE",
                            commands=(REPORT,))
    # the page's players name the audio files relative to the page instead of holding them
    link_audio: bool = opt(False, "link the audio files instead of embedding them", panel=OUTPUT,
                           commands=(REPORT,))
    # print the totals as one JSON object instead of the table
    json_out: bool = opt(False, "print the totals as one JSON object", panel=OUTPUT, flag="--json",
                         commands=(REPORT,))

    def __post_init__(self) -> None:
        check(self)
