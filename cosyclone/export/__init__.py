"""``cosyclone export``: run folders' good rows as a training set (Parquet, WebDataset, NeMo, Lhotse).

``build`` is the export (:func:`~cosyclone.export.build.export`), ``rows`` chooses the rows and reads
them, ``index`` finds each row's current record and eval line, ``shards`` and ``formats`` write the
formats, ``lock`` builds the export aside and swaps it in whole, ``card`` writes its dataset card,
``options`` and ``command`` are the command's options and door.
Imports run one way: this package reads run folders (the folder package) and sits above ``eval``, whose
records it may read; nothing but the doors imports it.
"""
