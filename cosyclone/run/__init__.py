"""The run-folder side of a run: the job, fingerprints and resume, journal, lock, writer, totals.

``job.SynthJob`` is one run of a manifest into an output folder (the CLI's ``synth`` and the API's
``synth_folder``); it runs the rows on an :class:`~cosyclone.engine.Engine` (this process) or a
Ray actor pool (``ray_pool``, sized by ``ray_plan``) and owns the stage-0 ``token_store``.
``folder`` is the folder as a dataset (record files, journal, audio paths, lock, fsync
discipline), ``index`` its SQLite index (where each row's current record lies, the kept totals),
``resume`` plans a run's rows against it, ``writer`` writes audio and records, ``settle`` ends a
run (its journal appended, its metadata written), ``report`` reads the totals.
Imports run one way: this package uses the engine, never the API or the CLI.
"""
