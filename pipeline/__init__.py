"""The ladder as a doit DAG: profiles, stage declarations, hashing, worker launch, receipts (docs/PIPELINE.md).

Imports neither torch nor any align module that does: doit's process stays light and a no-op `doit` stays fast."""
