"""The base layer: small helpers every layer above may use, importing nothing of cosyclone's but
:mod:`cosyclone.errors` (device and precision, CPU GEMM choice, batching rule, the tensor
serializer, progress, shards, the user cache, the version)."""
