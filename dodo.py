"""The align ladder as a doit DAG (docs/PIPELINE.md). `doit list` shows it; `doit profile=NAME TASK` picks a profile.

Thin by design: the profiles, stage declarations (pipeline/stages/), hashing, launcher and receipts live in
pipeline/."""

from pipeline.frame import install

install(globals())
