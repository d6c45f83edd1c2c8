"""Fold the pieces scripts/gpu_check.sh wrote into ONE JSON (`gpu_check.json`) and a short table (`gpu_check.txt`,
also printed). Usage: python bench/gpu_check_report.py OUT_DIR

OUT_DIR holds `steps.tsv` (step name, exit code, seconds: one line per step the script ran), `gpu_tests.log` (the
pytest output), `gates.json` (align.model.kernel_gates --json), `sft_step.json` and `decode.json` (one JSON line
each). A missing or unreadable piece is reported as such, never invented."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def _json(path: Path):
    """A whole JSON file, or else its last line (a bench's one JSON line after other output)."""
    try:
        text = path.read_text()
    except OSError as exc:
        return {"missing": f"{path.name}: {exc}"}
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        return {"missing": f"{path.name}: no JSON ({exc})"}


def _pytest_summary(path: Path) -> str:
    try:
        pattern = r"\d+ (passed|failed|skipped|deselected|errors?|tests? collected)"
        lines = [ln for ln in path.read_text().splitlines() if re.search(pattern, ln)]
    except OSError as exc:
        return f"missing: {exc}"
    return lines[-1].strip("= ") if lines else "no summary line"


def fold(out: Path) -> dict:
    steps = []
    for line in (out / "steps.tsv").read_text().splitlines() if (out / "steps.tsv").exists() else []:
        name, rc, sec = line.split("\t")
        steps.append({"step": name, "rc": int(rc), "seconds": int(sec)})
    gates = _json(out / "gates.json")
    return {"steps": steps, "gpu_tests": _pytest_summary(out / "gpu_tests.log"),
            "gates": gates if isinstance(gates, dict) else [
                {"name": g["name"], "kind": g["kind"], "passed": g["passed"], "device": g["device"],
                 "dtypes": sorted({c["dtype"] for c in g["cases"]}),
                 "max_err_over_bound": max(o.get("err_over_bound", float("inf")) for c in g["cases"]
                                           for o in c["outputs"].values())} for g in gates],
            "sft_step": _json(out / "sft_step.json"), "decode": _json(out / "decode.json"),
            "ok": bool(steps) and all(s["rc"] == 0 for s in steps)}


def table(rep: dict) -> str:
    rows = ["step                 rc   seconds"]
    rows += [f"{s['step']:<20} {s['rc']:<4} {s['seconds']}" for s in rep["steps"]]
    rows.append(f"gpu-marked tests: {rep['gpu_tests']}")
    if isinstance(rep["gates"], list):
        rows += [f"gate {g['name']:<12} {g['kind']:<9} {'PASS' if g['passed'] else 'FAIL'} {','.join(g['dtypes'])} "
                 f"max err/bound {g['max_err_over_bound']:.3g}" for g in rep["gates"]]
    else:
        rows.append(f"gates: {rep['gates']}")
    sft = rep["sft_step"]
    for arm, r in sft.get("arms", {}).items():
        rows.append(f"sft {sft.get('shape')} {arm:<13} " + (r["error"][:90] if "error" in r else
                    f"{r['tokens_per_s']:>10} tok/s  mfu {r['mfu']}  loss0 {r['loss_step0']}"))
    if "missing" in sft:
        rows.append(f"sft: {sft['missing']}")
    dec = rep["decode"]
    rows.append(f"decode {dec.get('shape')}: engine {dec.get('engine_tokens_per_s')} tok/s, transformers "
                f"{dec.get('transformers_tokens_per_s')} tok/s, greedy agreement {dec.get('greedy_token_agreement')}"
                if "missing" not in dec else f"decode: {dec['missing']}")
    rows.append("OK" if rep["ok"] else "NOT OK (a step failed: see steps)")
    return "\n".join(rows)


def main() -> int:
    out = Path(sys.argv[1])
    rep = fold(out)
    (out / "gpu_check.json").write_text(json.dumps(rep, indent=1, sort_keys=True))
    text = table(rep)
    (out / "gpu_check.txt").write_text(text + "\n")
    print(text)
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
