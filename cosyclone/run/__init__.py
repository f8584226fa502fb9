"""A run of a manifest into an output folder: the job, its plan and resume, the driver loop, the tally.

``job.SynthJob`` is one run (the CLI's ``synth`` and the API's ``synth_folder``); it runs the rows on an
:class:`~cosyclone.engine.Engine` (this process) or a Ray actor pool (:mod:`cosyclone.ray`) through the
one driver loop in ``drive``. ``plan`` reads the manifest and options, ``resume`` plans a run's rows
against the folder's index, ``parts`` cuts the manifest into parts, ``account`` tallies the rows as they
finish. The folder itself (records, index, writer, lock) is :mod:`cosyclone.folder`.
Imports run one way: this package uses Ray, the folder and the engine, never the API or the CLI.
"""
