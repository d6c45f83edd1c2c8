"""Every Triton kernel of align through Triton's real compiler for an H100 (sm_90: TTIR -> TTGIR -> LLVM -> PTX ->
cubin by the bundled ptxas), in fp32 and bf16, with the launch options the wrappers use. No GPU is needed to compile;
this catches what the interpreter tests cannot (the interpreter runs Python on numpy: it accepts code the compiler
rejects, e.g. a loop-carried value changing type, a non-power-of-two block, int32 pointer offsets)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from align.kernels import triton_ce, triton_moe, triton_norm, triton_rope, triton_rt, triton_swiglu

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="the triton extra is not installed (pip install -e '.[triton]')")

def _cases():
    """(id, kernel function, signature, constexprs, options) for each kernel and activation dtype."""
    out = []
    ce_sig = {"x_ptr": "*fp32", "stride": "i32", "y_ptr": "*i64", "vocab": "i32", "z_w": "fp32", "lse_ptr": "*fp32",
              "ce_ptr": "*fp32", "ent_ptr": "*fp32", "GRAD": "constexpr", "BLOCK": "constexpr"}
    for grad in (False, True):
        out.append((f"ce_rows-grad{grad}", triton_ce._ce_rows_kernel, ce_sig, {"GRAD": grad, "BLOCK": 4096},
                    {"num_warps": triton_ce.WARPS}))
    out.append(("softmax_grad", triton_ce._softmax_grad_kernel,
                {"x_ptr": "*fp32", "stride": "i32", "y_ptr": "*i64", "lse_ptr": "*fp32", "g_ptr": "*fp32",
                 "vocab": "i32", "BLOCK": "constexpr"}, {"BLOCK": 4096}, {"num_warps": triton_ce.WARPS}))
    for dt in ("fp32", "bf16"):
        p = f"*{dt}"
        out.append((f"rms_fwd-{dt}", triton_norm._fwd_kernel,
                    {"x_ptr": p, "w_ptr": p, "y_ptr": p, "r_ptr": "*fp32", "sx": "i32", "sy": "i32", "dim": "i32",
                     "eps": "fp32", "BLOCK": "constexpr"}, {"BLOCK": 4096}, {"num_warps": triton_norm._warps(4096)}))
        out.append((f"rms_bwd-{dt}", triton_norm._bwd_kernel,
                    {"x_ptr": p, "w_ptr": p, "g_ptr": p, "r_ptr": "*fp32", "dx_ptr": p, "dw_ptr": "*fp32",
                     "sx": "i32", "sg": "i32", "sdx": "i32", "rows": "i32", "dim": "i32", "band": "i32",
                     "BLOCK": "constexpr"}, {"BLOCK": 4096}, {"num_warps": triton_norm._warps(4096)}))
        for backward in (False, True):
            out.append((f"rope-{dt}-bwd{backward}", triton_rope._rope_kernel,
                        {"x_ptr": p, "c_ptr": p, "s_ptr": p, "y_ptr": p, "heads": "i32", "half": "i32", "sx": "i32",
                         "sy": "i32", "BACKWARD": "constexpr", "BLOCK_H": "constexpr", "BLOCK_D": "constexpr"},
                        {"BACKWARD": backward, "BLOCK_H": 32, "BLOCK_D": 64}, {}))
        out.append((f"swiglu_fwd-{dt}", triton_swiglu._fwd_kernel,
                    {"g_ptr": p, "u_ptr": p, "y_ptr": p, "sg": "i32", "su": "i32", "sy": "i32", "cols": "i32",
                     "BLOCK": "constexpr"}, {"BLOCK": triton_swiglu.BLOCK}, {}))
        out.append((f"swiglu_bwd-{dt}", triton_swiglu._bwd_kernel,
                    {"g_ptr": p, "u_ptr": p, "d_ptr": p, "dg_ptr": p, "du_ptr": p, "sg": "i32", "su": "i32",
                     "sd": "i32", "sdg": "i32", "sdu": "i32", "cols": "i32", "BLOCK": "constexpr"},
                    {"BLOCK": triton_swiglu.BLOCK}, {}))
        out.append((f"moe_gather-{dt}", triton_moe._gather_kernel,
                    {"src_ptr": p, "idx_ptr": "*i64", "out_ptr": p, "s_src": "i32", "s_out": "i32", "cols": "i32",
                     "div": "i32", "BLOCK": "constexpr"}, {"BLOCK": triton_moe.BLOCK}, {}))
        out.append((f"moe_fold-{dt}", triton_moe._fold_kernel,
                    {"g_ptr": p, "inv_ptr": "*i64", "out_ptr": p, "s_g": "i32", "s_out": "i32", "cols": "i32",
                     "k": "i32", "BLOCK": "constexpr"}, {"BLOCK": triton_moe.BLOCK}, {}))
    return out


def compile_all() -> dict[str, str]:
    """Compile every case in this process (run in a child without TRITON_INTERPRET: Triton's own library functions
    are compiled or interpreted ones from the moment triton.language is imported). name -> "ok" or the error."""
    import triton  # noqa: PLC0415 (the child process only)
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.compiler import ASTSource  # noqa: PLC0415

    h100 = GPUTarget("cuda", 90, 32)
    results = {}
    for name, fn, sig, constexprs, options in _cases():
        try:
            kernel = triton.compile(ASTSource(fn=triton_rt.jit(fn), signature=sig, constexprs=constexprs),
                                    target=h100, options={"enable_fp_fusion": True, **options})
            ok = kernel.asm.get("cubin") and ".entry" in kernel.asm["ptx"]
            results[name] = "ok" if ok else f"no cubin/entry: {sorted(kernel.asm)}"
        except Exception as exc:  # noqa: BLE001 (reported by name to the parent test)
            results[name] = f"{type(exc).__name__}: {exc}"[:2000]
    return results


@needs_triton
def test_every_kernel_compiles_for_h100():
    env = {k: v for k, v in os.environ.items() if k != triton_rt.INTERPRET_ENV}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # what 3.9 defaults to, said outright (silences its warning)
    proc = subprocess.run([sys.executable, str(Path(__file__))], env=env, capture_output=True, text=True,
                          timeout=600, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == len(_cases()) == 19
    failed = {k: v for k, v in results.items() if v != "ok"}
    assert not failed, failed


if __name__ == "__main__":
    print(json.dumps(compile_all()))
