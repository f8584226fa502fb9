"""The model as data: configuration read once (``config``, the yaml as data in ``hyperyaml``), the
one checkpoint loader (``checkpoint``) and the fused projections the stage modules are built from
(``fused``). Below the stages, above the base."""
