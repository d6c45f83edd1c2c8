"""One module per ladder stage, each defining `STAGE = StageSpec(...)`; see docs/PIPELINE.md."""
