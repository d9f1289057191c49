#!/usr/bin/env python3
"""Flash attention's scaling on a LLaMA-style block, from sequence 128 to 4,096.

    python bench/attention_scaling.py [--kiln build/kiln] [--node-times build/bench/kiln_bench_node_times]
                                      [--seqs 128 256 512 1024 2048 4096] [--threads 1] [--runs 5]
                                      [--compare] [--bf16] [--work-dir DIR]

Generates the test suite's LLaMA-style decoder (tests/models/make_models.py: 2 layers, 8 query
heads and 2 KV heads of 64, an additive causal mask built from Range/Less/Where) with rotary
tables of 4,096 positions and a vocabulary of 256 (so that the LM head does not drown the
attention), exports it once with a symbolic sequence, and for each length compiles it for that
length and runs kiln_bench_node_times on it: the Attention nodes' time (both layers, median over
--runs runs after warm-up), the memory arena and the kernels' workspace. Each row also shows the
growth from the previous row: doubling the sequence should take the attention time ×4
(quadratic work) and the arena and workspace ×2 (linear memory: no S×S buffer anywhere, the
causal mask included). With --compare, the same model without kiln's flash attention (oneDNN's
two matmuls around a softmax, whose scores take S×S floats per head of workspace). oneDNN's
attention neither rotates Q and K nor reads the [B, S, H·D] projections, so that variant is
compiled with fuse_rotary after fuse_attention: the rotations stay RotaryEmbedding nodes and
the heads [B, H, S, D] (kiln's flash attention takes the rotary caches and the projections).
With --bf16, the block compiled with --precision bf16 too: on a CPU with AMX its attention
runs kiln.attention_bf16_amx (bf16 products on AMX tiles, the softmax in f32).
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "models"))
import onnx  # noqa: E402
from make_models import make_llama  # noqa: E402

FLASH = ["kiln.attention_f32_avx512", "kiln.attention_f32_avx2"]


def node_times(args, model, inputs, without):
    cmd = [args.node_times, model, inputs, "--threads", str(args.threads), "--runs", str(args.runs), "--top", "100"]
    if without:
        cmd += ["--without", ",".join(without)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    head = re.search(r"arena (\d+) bytes, workspace (\d+) bytes", out)
    attention = re.search(r"^\s*([\d.]+) ms .*Attention \[([^\]]+)\]", out, re.M)
    if not head or not attention:
        raise SystemExit(f"attention_scaling: unexpected kiln_bench_node_times output:\n{out}")
    return float(attention.group(1)), attention.group(2), int(head.group(1)), int(head.group(2))


def unfolded_rotary_passes(kiln):
    """kiln compile's pass list with fuse_rotary moved after fuse_attention."""
    out = subprocess.run([kiln, "compile", "--list-passes"], check=True, capture_output=True, text=True).stdout
    passes = [line.split()[0] for line in out.splitlines() if line.strip()]
    passes.remove("fuse_rotary")
    passes.insert(passes.index("fuse_attention") + 1, "fuse_rotary")
    return ["--passes", ",".join(passes)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    parser.add_argument("--node-times", default=os.path.join(ROOT, "build", "bench", "kiln_bench_node_times"))
    parser.add_argument("--seqs", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--compare", action="store_true", help="also without kiln's flash attention")
    parser.add_argument("--bf16", action="store_true", help="also compiled with --precision bf16")
    parser.add_argument("--work-dir", help="where the models go (default: a temporary folder)")
    args = parser.parse_args(argv)
    work = args.work_dir or tempfile.mkdtemp(prefix="kiln-attention-")
    os.makedirs(work, exist_ok=True)
    max_pos = max(args.seqs)
    model, _ = make_llama(seq=max_pos, vocab=256, max_pos=max_pos)
    onnx_path = os.path.join(work, "llama_block.onnx")
    onnx.save_model(model, onnx_path)
    exported = os.path.join(work, "llama_block.kiln")
    subprocess.run([args.kiln, "export", onnx_path, "-o", exported], check=True)
    rng = np.random.default_rng(0)
    variants = [("kiln flash", [], [], "")]
    if args.compare:
        variants.append(("without flash", FLASH, unfolded_rotary_passes(args.kiln), ".unfolded"))
    if args.bf16:
        variants.append(("kiln bf16", [], ["--precision", "bf16"], ".bf16"))
    print(f"# LLaMA-style block (2 layers, 8 q / 2 kv heads of 64), {args.threads} thread(s), "
          f"median of {args.runs} runs; growth = this row / the row before")
    print(f"{'variant':14s} {'seq':>5s} {'kernel':26s} {'attention ms':>12s} {'growth':>7s} "
          f"{'arena MiB':>10s} {'growth':>7s} {'workspace MiB':>13s} {'growth':>7s}")
    for name, without, compile_args, tag in variants:
        prev = None
        for seq in args.seqs:
            compiled = os.path.join(work, f"llama_block.s{seq}{tag}.kiln")
            inputs = os.path.join(work, f"llama_block.s{seq}.npz")
            if not os.path.exists(compiled):
                subprocess.run([args.kiln, "compile", exported, "-o", compiled, "--input-shape", f"input_ids=1x{seq}",
                                "--threads", str(args.threads)] + compile_args, check=True, capture_output=True)
            if not os.path.exists(inputs):
                np.savez(inputs, input_ids=rng.integers(0, 256, size=(1, seq), dtype=np.int64))
            ms, kernel, arena, workspace = node_times(args, compiled, inputs, without)
            row = (ms, arena, workspace)
            grow = [f"{a / b:7.2f}" if prev and b else f"{'':7s}" for a, b in zip(row, prev or row)]
            print(f"{name:14s} {seq:5d} {kernel:26s} {ms:12.3f} {grow[0]} {arena / 2**20:10.2f} {grow[1]} "
                  f"{workspace / 2**20:13.2f} {grow[2]}")
            prev = row
    return 0


if __name__ == "__main__":
    sys.exit(main())
