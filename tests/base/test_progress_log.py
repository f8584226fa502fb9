"""Progress a night's log can use: off a terminal, one plain line at a steady interval, with rows
done and failed, rows/s and the ETA, even while no row finishes (a timer thread writes it)."""

from __future__ import annotations

import io
import re
import time
from dataclasses import dataclass

from cosyclone.base.progress import Progress

LINE = re.compile(r"^synth: (\d+)/10 rows \((\d+)%\), (\d+) done, (\d+) failed, (\d+\.\d\d) rows/s, "
                  r"\d+\.\d\d audio-s/s, ETA (\S+), elapsed \S+$")


@dataclass(frozen=True)
class Row:
    ok: bool
    audio_seconds: float = 1.0


def test_off_a_terminal_a_line_comes_every_interval_with_done_failed_rate_and_eta() -> None:
    log = io.StringIO()
    progress = Progress(10, stream=log, tty=False, interval=0.2)
    for ok in (True, True, False):
        progress.update(Row(ok))
    time.sleep(1.1)  # no row finishes meanwhile: the lines still come, on time
    progress.close()
    lines = log.getvalue().splitlines()
    assert 4 <= len(lines) <= 7, lines  # about 1.1 / 0.2 ticks, then the final line
    for line in lines:
        m = LINE.match(line)
        assert m, line
        assert m.group(1, 2, 3, 4) == ("3", "30", "2", "1")
        assert float(m.group(5)) > 0 and m.group(6) != "?"  # a rate, and the ETA it gives for the 7 rows left


def test_no_line_before_the_first_interval_and_none_when_quiet() -> None:
    log = io.StringIO()
    progress = Progress(10, stream=log, tty=False, interval=30.0)
    progress.update(Row(True))
    progress.close()
    assert len(log.getvalue().splitlines()) == 1  # the final line only: nothing is due yet
    quiet = io.StringIO()
    Progress(10, stream=quiet, tty=False, interval=0.01, quiet=True).close()
    assert quiet.getvalue() == ""
