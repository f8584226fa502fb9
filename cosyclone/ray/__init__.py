"""Ray as a row source for a run: the sizing rule, the actor pool and its actors.

``plan`` sizes a pool on node shapes (its per-actor footprint in ``footprint``), ``cluster`` reads the
live cluster and plans on it, ``pool`` is the driver's :class:`~cosyclone.ray.pool.RaySource` (a
``RowSource`` for :mod:`cosyclone.run.drive`), ``actor`` the engine an actor runs. Imports run one way:
the run uses this package; it uses the folder's token store and the engine, never the run.
"""
