"""A learner in service: ``ciosl serve`` (``server``), its HTTP API (``app``), the single writer
and the write-ahead log behind it (``service``, ``wal``) and ``Client``, which mirrors the
Learner calls over HTTP. The rule and its guarantees: docs/serve.md."""
