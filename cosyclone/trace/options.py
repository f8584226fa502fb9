"""What ``cosyclone trace`` shows and compares, declared in the option registry.

Like a run's options (:mod:`cosyclone.options`): one field per option with its flag, help line and
panel, so ``--help``, docs/cli.md and the bounds check read one table. The row's own options are
not here: from a folder they come from its record, from a manifest they are the run options
(:data:`cosyclone.options.ROW` lists ``trace`` among their commands).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cosyclone.options import TRACE, DtypeName, NonfinitePolicy, check, opt

TRACING = "Trace"  # trace's --help group


@dataclass(frozen=True)
class TraceOptions:
    """What ``cosyclone trace`` shows and compares (the row's own options come from its record)."""

    # the model, where it has moved (None: the run's recorded model; a manifest: $COSYCLONE_MODEL_DIR).
    # No environment default from a folder: the run's model is what made the row.
    model_dir: Path | None = opt(None, "the model folder (default: the run's)", panel=TRACING, metavar="DIR",
                                 commands=(TRACE,))
    # the manifest row to replay (the manifest form: trace MANIFEST --id ID)
    id: str | None = opt(None, "the row to trace (with a manifest)", panel=TRACING, metavar="ID",
                         commands=(TRACE,))
    # each Qwen2 layer's output per step (and the DiT blocks' and HiFT stages'): abs max and finiteness
    layers: bool = opt(False, "per layer per step: abs max, finite", panel=TRACING, commands=(TRACE,))
    # candidate ids shown per step, with their probabilities
    top: int = opt(5, "candidates shown per step (5)", panel=TRACING, low=1, metavar="N", commands=(TRACE,))
    # from a folder: replay again at this dtype and compare; from a manifest: the replay's dtype (None: auto)
    dtype: DtypeName | None = opt(None, "also replay at this dtype, side by side", panel=TRACING,
                                  metavar="TYPE", commands=(TRACE,))
    # from a folder: replay again under this policy and compare; from a manifest: the replay's (None: exclude)
    nonfinite_policy: NonfinitePolicy | None = opt(None, "also replay under this NaN policy", panel=TRACING,
                                                   metavar="P", commands=(TRACE,))

    def __post_init__(self) -> None:
        check(self)
