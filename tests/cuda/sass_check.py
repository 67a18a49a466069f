#!/usr/bin/env python3
"""The CUDA kernels' compiled code, checked (ctest sass.kernels; docs/performance.md's SASS table).

No GPU has run these kernels, so the machine code nvcc 13 produces for sm_80 and sm_90 is the
evidence of their speed. For every kernel of the build's CUDA objects (build/CMakeFiles/llmt_cuda.dir,
compiled for both architectures by CMakeLists.txt) this reads `cuobjdump --dump-resource-usage`
(registers, stack, static shared memory) and `cuobjdump -sass`, and checks what the design states
(EXPECT below): no stack (local memory) for the attention and norm kernels, HMMA in every tensor-core
kernel, 128-bit global loads (LDG.E.128, or LDGSTS.E.BYPASS.128 for cp.async) where the kernel is
vectorised, at least the blocks per SM it was sized for, and for flash attention's forward at most 8
instructions per HMMA on the main loop's path through an unmasked tile.

  sass_check.py BUILD_DIR              check; exit 1 naming every kernel that fails
  sass_check.py BUILD_DIR --table      also print the markdown table for docs/performance.md
"""
import glob
import os
import re
import shutil
import subprocess
import sys

# What each architecture gives a block (CUDA C Programming Guide, compute capabilities 8.0 and 9.0).
ARCH = {
    "sm_80": {"regs": 65536, "smem": 164 * 1024, "smem_block_max": 163 * 1024, "threads": 2048, "blocks": 32},
    "sm_90": {"regs": 65536, "smem": 228 * 1024, "smem_block_max": 227 * 1024, "threads": 2048, "blocks": 32},
}

# Dynamic shared memory per launch, as flash_attention.cu sizes it (forward_shared_bytes,
# backward_shared_bytes): (rows of HS + 8 bf16) and the backward's dS^T (64 x 72 bf16) and per-row
# f32 lse, f32 D and int document starts.
def flash_forward_shared(hs):
    return 4 * 64 * (hs + 8) * 2


def flash_backward_shared(hs):
    stages = 2 if hs <= 64 else 1
    return (2 + 2 * stages) * 64 * (hs + 8) * 2 + 64 * 72 * 2 + stages * 64 * 12


# name pattern -> (threads per block, dynamic shared bytes or None, checks)
#   stack0: no local memory; hmma: tensor-core kernel; ld128: 128-bit global loads or cp.async;
#   blocks: at least this many blocks per SM on both architectures; per_hmma: instructions per HMMA
#   on the main loop's unmasked path at most this.
EXPECT = [
    # <HS, DROPOUT, SOFTCAP>: the soft cap (Gemma 2) is an instantiation of its own, the others' loop unchanged
    (r"flash_forward_kernel<64, false, false>", 128, flash_forward_shared(64),
     {"stack0": 1, "hmma": 1, "ld128": 1, "blocks": 3, "per_hmma": 8}),
    (r"flash_forward_kernel<64, (true, (false|true)|false, true)>", 128, flash_forward_shared(64),
     {"stack0": 1, "hmma": 1, "ld128": 1, "blocks": 3}),
    (r"flash_forward_kernel<128, false, false>", 128, flash_forward_shared(128),
     {"stack0": 1, "hmma": 1, "ld128": 1, "blocks": 2, "per_hmma": 8}),
    (r"flash_forward_kernel<128, (true, (false|true)|false, true)>", 128, flash_forward_shared(128),
     {"stack0": 1, "hmma": 1, "ld128": 1, "blocks": 2}),
    (r"flash_backward_kernel<64, (false, (false|true)|true, false)>", 128, flash_backward_shared(64),
     {"stack0": 1, "hmma": 1, "ld128": 1, "blocks": 2}),
    # the soft cap with attention dropout at head size 64: at 255 registers, ptxas spills 40-48 bytes
    # (Gemma 2 trains without attention dropout, at head size 128 or 256); docs/performance.md
    (r"flash_backward_kernel<64, true, true>", 128, flash_backward_shared(64), {"hmma": 1, "ld128": 1, "blocks": 2}),
    (r"flash_backward_kernel<128, (false|true), (false|true)>", 128, flash_backward_shared(128),
     {"stack0": 1, "hmma": 1, "ld128": 1, "blocks": 2}),
    (r"flash_dq_reduce_kernel", 256, 0, {"stack0": 1, "ld128": 1}),
    # the memory-bound kernels: the norms (scalar and vectorised), their column sums, AdamW, the loss
    (r"(layernorm|rmsnorm)_(forward|backward_dx)_vec_kernel<.*>", 256, 0, {"stack0": 1, "ld128": 1}),
    (r"(layernorm|rmsnorm)_(forward|backward_dx)_kernel<.*>", 256, 0, {"stack0": 1}),
    # Qwen3's q/k norms: one block a head, and the weight gradients' column partials
    (r"head_rmsnorm_(forward|backward_dx|dw_partials)_kernel<.*>", 128, 0, {"stack0": 1}),
    (r"column_partials_kernel<.*, [48]>", 256, 0, {"stack0": 1, "ld128": 1}),
    (r"adamw_kernel<4>", 256, 0, {"stack0": 1, "ld128": 1}),
    (r"cross_entropy_kernel<.*, [48]>", 256, 0, {"stack0": 1, "ld128": 1}),
    (r"mma_(fragments|ldmatrix)_kernel", 32, 0, {"stack0": 1, "hmma": 1}),
    # cuDNN's packed documents: the ragged offsets built on the device, and the stats' layout
    (r"(llmt::cuda::)?document_batch_kernel", 1024, 0, {"stack0": 1}),
    (r"(llmt::cuda::)?stats_layout_kernel", 256, 0, {"stack0": 1}),
]


def find_cuobjdump():
    for p in [shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"]:
        if p and os.path.exists(p):
            return p
    try:  # pip install nvidia-cuda-cuobjdump
        import nvidia
        for root in nvidia.__path__:
            for p in glob.glob(os.path.join(root, "*", "bin", "cuobjdump")):
                return p
    except ImportError:
        pass
    return None


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return dict(zip(names, out.strip().split("\n")))


def short(name):
    """llmt::cuda::(anonymous namespace)::flash_forward_kernel<64, false>(unsigned short*, ...) -> the template id."""
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"^llmt::cuda::\(anonymous namespace\)::", "", name)
    depth, out = 0, ""
    for ch in name:
        if ch == "(" and depth == 0:
            break
        depth += ch == "<"
        depth -= ch == ">"
        out += ch
    return out


def resources(cuobjdump, obj):
    """{(arch, mangled): {REG, STACK, SHARED}} from --dump-resource-usage."""
    text = subprocess.run([cuobjdump, "--dump-resource-usage", obj], capture_output=True, text=True, check=True).stdout
    res, arch = {}, None
    lines = text.split("\n")
    for i, line in enumerate(lines):
        m = re.match(r"arch = (sm_\d+)", line.strip())
        if m:
            arch = m.group(1)
        m = re.match(r"\s*Function (\S+):", line)
        if m and arch:
            vals = dict(re.findall(r"(\w+):(\d+)", lines[i + 1]))
            res[(arch, m.group(1))] = {k: int(v) for k, v in vals.items()}
    return res


def sass(cuobjdump, obj, arch):
    """{mangled: [(address, instruction)]} for one architecture."""
    text = subprocess.run([cuobjdump, "-sass", "-arch", arch, obj], capture_output=True, text=True, check=True).stdout
    funcs = {}
    for part in re.split(r"\n\s*Function : ", text)[1:]:
        name = part.split("\n")[0].strip()
        ins = []
        for line in part.split("\n"):
            m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
            if m:
                ins.append((int(m.group(1), 16), m.group(2)))
        funcs[name] = ins
    return funcs


def opcode(ins):
    words = ins.split()
    return words[1] if words[0].startswith("@") else words[0]


def main_loop_per_hmma(ins):
    """Instructions per HMMA on the cheapest path through the loop that holds the most HMMA, taking
    every HMMA of it (a path through an unmasked tile): the loop body's basic blocks in address order,
    a dynamic programme over its forward branches."""
    best = None
    for a, i in ins:
        m = re.search(r"BRA\s+(?:`\()?.*?0x([0-9a-f]+)", i)
        if not m or int(m.group(1), 16) >= a:
            continue
        head = int(m.group(1), 16)
        body = [(x, y) for x, y in ins if head <= x <= a]
        h = sum("HMMA" in y for _, y in body)
        if h and (best is None or h > best[2]):
            best = (head, a, h)
    if not best:
        return None
    head, tail, _ = best
    body = [(x, y) for x, y in ins if head <= x <= tail]
    addrs = [x for x, _ in body]
    # (hmma, instructions) of the best path reaching each address; branches inside the loop only
    state = {addrs[0]: (0, 0)}
    for k, (x, y) in enumerate(body):
        if x not in state:
            continue
        h, n = state[x]
        h, n = h + ("HMMA" in y), n + 1
        nexts = []
        m = re.search(r"BRA\s+(?:`\()?.*?0x([0-9a-f]+)", y)
        conditional = y.split()[0].startswith("@")
        if m and head <= int(m.group(1), 16) <= tail and int(m.group(1), 16) > x:
            nexts.append(int(m.group(1), 16))
        if (not m or conditional) and k + 1 < len(body):
            nexts.append(body[k + 1][0])
        for t in nexts:
            old = state.get(t)
            if old is None or (h, -n) > (old[0], -old[1]):
                state[t] = (h, n)
    # the back edge, or (a loop left by other branches) the best path reaching anywhere in it
    h, n = state.get(addrs[-1]) or max(state.values(), key=lambda v: (v[0], -v[1]))
    return n / h if h else None


def blocks_per_sm(arch, regs, threads, shared):
    a = ARCH[arch]
    warps = (threads + 31) // 32
    regs_warp = ((max(regs, 1) * 32 + 255) // 256) * 256
    by_regs = a["regs"] // (regs_warp * warps)
    by_smem = a["smem"] // max(shared + 1024, 1)  # the 1 KiB a block's shared memory carries on sm_8x/9x
    return min(by_regs, by_smem, a["threads"] // threads, a["blocks"]), shared + 1024 <= a["smem_block_max"] + 1024


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    build, table = sys.argv[1], "--table" in sys.argv
    objs = sorted(glob.glob(os.path.join(build, "CMakeFiles", "llmt_cuda.dir", "kernels", "cuda", "*.cu.o")))
    if not objs:
        print("sass_check: no CUDA objects under %s (a build without nvcc): nothing to check" % build)
        return 0
    cuobjdump = find_cuobjdump()
    if not cuobjdump:
        print("sass_check: cuobjdump not found (pip install nvidia-cuda-cuobjdump): the SASS checks did not run")
        return 77
    failures, rows, seen = [], [], set()
    for obj in objs:
        res = resources(cuobjdump, obj)
        if not res:
            continue
        names = demangle(sorted({n for _, n in res}))
        for arch in ARCH:
            code = sass(cuobjdump, obj, arch)
            for (a, mangled), r in sorted(res.items()):
                if a != arch:
                    continue
                kernel = short(names[mangled])
                rule = next((e for e in EXPECT if re.fullmatch(e[0], kernel)), None)
                ins = code.get(mangled, [])
                ops = [opcode(i) for _, i in ins]
                hmma = sum(o.startswith("HMMA") for o in ops)
                ld128 = sum(o.startswith(("LDG.E.128", "LDGSTS.E.BYPASS.128", "LDG.E.ENL2.128")) for o in ops)
                per = main_loop_per_hmma(ins) if hmma else None
                row = {"kernel": kernel, "arch": arch, "regs": r.get("REG", 0), "stack": r.get("STACK", 0),
                       "shared": r.get("SHARED", 0), "hmma": hmma, "ld128": ld128, "per_hmma": per,
                       "instructions": len(ins)}
                if rule:
                    seen.add(rule[0])
                    threads, dyn, want = rule[1], rule[2], rule[3]
                    row["dynamic"] = dyn
                    # sm_90's report counts the 1 KiB every block's shared memory carries; sm_80's does not
                    static = row["shared"] - (1024 if arch == "sm_90" and row["shared"] >= 1024 else 0)
                    blocks, fits = blocks_per_sm(arch, row["regs"], threads, static + dyn)
                    row["blocks"] = blocks
                    why = []
                    if want.get("stack0") and row["stack"]:
                        why.append("%d bytes of stack (local memory)" % row["stack"])
                    if want.get("hmma") and not hmma:
                        why.append("no HMMA")
                    if want.get("ld128") and not ld128:
                        why.append("no 128-bit global loads")
                    if "blocks" in want and blocks < want["blocks"]:
                        why.append("%d blocks per SM, designed for %d" % (blocks, want["blocks"]))
                    if not fits:
                        why.append("more shared memory than a block may have")
                    if "per_hmma" in want and (per is None or per > want["per_hmma"]):
                        why.append("%s instructions per HMMA in the main loop (at most %d)" %
                                   ("no loop" if per is None else "%.1f" % per, want["per_hmma"]))
                    if why:
                        failures.append("%s (%s): %s" % (kernel, arch, "; ".join(why)))
                    rows.append(row)
                elif table and (hmma or row["stack"]):
                    rows.append(row)
    for e in EXPECT:
        if e[0] not in seen:
            failures.append("no kernel matches %s: renamed, or not compiled?" % e[0])
    if table:
        print("| kernel | arch | registers | stack | shared (static + dynamic) | blocks/SM | HMMA | 128-bit loads | instructions per HMMA (main loop) |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            print("| `%s` | %s | %d | %d | %d + %s | %s | %d | %d | %s |" % (
                r["kernel"], r["arch"], r["regs"], r["stack"], r["shared"], r.get("dynamic", "?"), r.get("blocks", "?"),
                r["hmma"], r["ld128"], "%.1f" % r["per_hmma"] if r["per_hmma"] else "-"))
    if failures:
        print("sass_check: %d kernel(s) fail what the design states:" % len(failures))
        for f in failures:
            print("  " + f)
        return 1
    print("sass_check: %d kernel builds checked, all as designed" % len(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
