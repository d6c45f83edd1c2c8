"""align.stages.ingest: one parquet source -> validated, de-duplicated records (`ingest:<source>`).

    python -m align.stages.ingest --config configs/tiny/ingest.toml source=math_sft

Publishes `<run_dir>/out/` (records.parquet + manifest.json, kind "records") and `<run_dir>/metrics.json` (row
counts, the decontamination's counts). Every source is checked against the evaluation sets of `[decontam]`
(align.data.decontam: registered sets, held-out sources; matches flagged or dropped, reported in the manifest).
Source paths are relative to the project root ($ALIGN_ROOT, else the working directory)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from align.config import load_cli_config, run_dir_from_env, write_resolved_config
from align.data.decontam import DecontamConfig, load_references
from align.data.ingest_parquet import SourceConfig, ingest_source
from align.exceptions import ConfigError
from align.exit_codes import exit_stage
from align.utils.fsio import atomic_write_json

METRIC_KEYS = ("rows_in", "rows_out", "duplicates", "rejected")


@dataclass(frozen=True)
class IngestStageConfig:
    sources: dict[str, SourceConfig] = field(default_factory=dict)  # name -> source; `ingest:<name>` per entry
    source: str = ""  # the one this run ingests (the pipeline passes `source=<name>`)
    decontam: DecontamConfig = field(default_factory=DecontamConfig)  # n-gram check against the evaluation sets


def main() -> int:
    cfg = load_cli_config(IngestStageConfig, prog="align.stages.ingest")
    if cfg.source not in cfg.sources:
        raise ConfigError(f"ingest: source {cfg.source!r} is not configured; configured sources: "
                          f"{', '.join(sorted(cfg.sources)) or '(none)'} (pass source=<name>)")
    run_dir = run_dir_from_env(Path("runs/tiny/ingest") / cfg.source)
    write_resolved_config(cfg, run_dir)
    root = Path(os.environ.get("ALIGN_ROOT", "."))
    references = load_references(cfg.decontam, cfg.sources, root)
    screen = references.screen(cfg.source, cfg.sources[cfg.source].location)
    manifest = ingest_source(cfg.source, cfg.sources[cfg.source], run_dir / "out", base_dir=root, screen=screen)
    metrics = {k: manifest[k] for k in METRIC_KEYS}
    decontam = manifest["decontam"]
    metrics["decontam"] = {k: decontam[k] for k in ("n", "threshold", "action", "references", "checked", "matched",
                                                    "dropped") + (("skipped",) if "skipped" in decontam else ())}
    print(f"ingest:{cfg.source}: " + (decontam["skipped"] if "skipped" in decontam else
          f"{decontam['matched']} of {decontam['checked']} records match an evaluation item "
          f"({cfg.decontam.n}-grams, overlap >= {cfg.decontam.threshold}; {decontam['dropped']} dropped)"))
    if "outcome_agreement" in manifest:  # step-labelled data: the verifier against the dataset's own verdicts
        metrics["outcome_agreement"] = {k: v for k, v in manifest["outcome_agreement"].items() if k != "disagreements"}
        agreement = manifest["outcome_agreement"]
        rate = "n/a" if agreement["agreement"] is None else f"{agreement['agreement']:.3f}"
        print(f"ingest:{cfg.source}: verifier agrees with the final-answer labels on {rate} of "
              f"{agreement['compared']} finished solutions")
    atomic_write_json(run_dir / "metrics.json", metrics)
    print(f"ingest:{cfg.source}: {manifest['rows_out']} of {manifest['rows_in']} rows kept "
          f"({manifest['duplicates']} duplicates, {manifest['rejected']} rejected) -> {run_dir / 'out'}")
    return 0


if __name__ == "__main__":
    exit_stage(main)
