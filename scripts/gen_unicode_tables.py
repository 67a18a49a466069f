#!/usr/bin/env python3
"""Generates data/unicode_tables.h (the character classes the pre-tokenizer patterns use) and
data/unicode_norm_tables.h (what NFC needs: data/unicode_norm.cpp).

The GPT-2 / LLaMA-3 pre-tokenizer regexes need three Unicode classes: \\p{L} (General_Category
Letter: Lu Ll Lt Lm Lo), \\p{N} (Number: Nd Nl No) and \\s (White_Space: Zs Zl Zp plus U+0009..U+000D
and U+0085, which is how Oniguruma and Rust's regex crate define it). Everything else is "other".

Hugging Face tokenizers (Oniguruma) and tiktoken (Rust regex crate) both use Unicode 16.0 today,
so this script reads the Unicode 16.0 database from the `unicodedata2` package (Python's own
unicodedata is older: 14.0 in Python 3.11):

    pip install unicodedata2==16.0.0 tokenizers
    python3 scripts/gen_unicode_tables.py            # writes both headers
    python3 scripts/gen_unicode_tables.py --verify   # also checks both against HF tokenizers (minutes)

unicode_tables.h layout: a two-stage table. stage1[cp >> 8] names a 256-code-point block; each
block holds 2 bits per code point (0 other, 1 letter, 2 number, 3 space), so equal blocks are
stored once.

unicode_norm_tables.h (canonical composition, UAX #15), each array sorted for binary search:
  kCccRanges      first, last code point and their canonical combining class, for ccc != 0
  kNfdCp/Start/Pool  the full (recursive) canonical decomposition of each code point that has one:
                  kNfdPool[kNfdStart[i] .. kNfdStart[i + 1]) for kNfdCp[i]
  kNfcPairs/kNfcComposite  the primary composites: first << 21 | second -> composite, i.e. each
                  code point whose canonical decomposition is two characters and whose NFC is
                  itself (leaving out composition exclusions, singletons, non-starter decompositions)
Hangul syllables are left out of all three: they decompose and compose by arithmetic.

Unlike its pre-tokenizer, HF tokenizers' NFC normalizer (0.23: the crate
unicode-normalization-alignments 0.1.12) carries Unicode 9.0 tables. It is the peer llmt must match,
so the NFC tables hold the Unicode 16.0 entries that tokenizers knows: a class where tokenizers'
NFD moves the mark between two others, a decomposition where tokenizers' NFD decomposes the code
point (the normalization stability policy keeps every older entry unchanged, so this is Unicode
9.0's data: 814 classes, 2060 decompositions, 940 composites, the crate's own counts, asserted).
Left out: the 120 marks, 21 decompositions and 21 composites added since (Dives Akuru U+11938,
Todhri U+105C9 U+105E4, Tulu-Tigalari U+11383.., Gurung Khema U+16121.., Kirat Rai U+16D68..).
--verify runs the composition these tables drive (in Python, as data/unicode_norm.cpp does it) over
every code point alone, in NFD, in NFC and between two marks, every composable first and second,
and Hangul jamo pairs, against tokenizers' NFC.
"""
import argparse
import os
import sys

import unicodedata2 as ud

OTHER, LETTER, NUMBER, SPACE = 0, 1, 2, 3
EXTRA_SPACE = {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x85}


def category(cp):
    if 0xD800 <= cp <= 0xDFFF:
        return OTHER  # surrogates never appear in valid UTF-8
    c = ud.category(chr(cp))
    if cp in EXTRA_SPACE or c in ("Zs", "Zl", "Zp"):
        return SPACE
    if c[0] == "L":
        return LETTER
    if c[0] == "N":
        return NUMBER
    return OTHER


def verify(cats):
    """Classifies every code point with HF tokenizers' ByteLevel pre-tokenizer (Oniguruma)."""
    from tokenizers import pre_tokenizers
    pt = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bad = 0
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        # "a"+c is one piece iff c is a letter; "1"+c iff a number; "!"+c iff other; else space
        if len(pt.pre_tokenize_str("a" + c)) == 1:
            hf = LETTER
        elif len(pt.pre_tokenize_str("1" + c)) == 1:
            hf = NUMBER
        elif len(pt.pre_tokenize_str("!" + c)) == 1:
            hf = OTHER
        else:
            hf = SPACE
        if hf != cats[cp]:
            bad += 1
            if bad <= 20:
                print(f"U+{cp:04X}: table {cats[cp]}, HF tokenizers {hf}", file=sys.stderr)
    print(f"verify: {bad} code points differ from HF tokenizers", file=sys.stderr)
    return bad == 0


HANGUL_S, HANGUL_COUNT = 0xAC00, 11172
L_BASE, V_BASE, T_BASE = 0x1100, 0x1161, 0x11A7
PROBE_HI, PROBE_LO = "\u0345", "\u0334"  # marks of class 240 and 1: a mark between them moves iff its class is known


def norm_tables():
    """ccc ranges, full canonical decompositions, primary composites (Hangul left out), as
    unicodedata2 16.0 gives them restricted to what HF tokenizers' NFC knows."""
    from tokenizers import normalizers
    hf_nfd = normalizers.NFD()
    ccc, nfd, pairs = {}, {}, {}
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF or HANGUL_S <= cp < HANGUL_S + HANGUL_COUNT:
            continue
        c = chr(cp)
        if ud.combining(c):
            probe = "x" + PROBE_HI + c + PROBE_LO  # unchanged by NFD iff tokenizers takes c for a starter
            if hf_nfd.normalize_str(probe) != probe:
                ccc[cp] = ud.combining(c)
        d = ud.decomposition(c)
        if d and not d.startswith("<") and hf_nfd.normalize_str(c) != c:  # canonical (not "<tag> ...")
            assert hf_nfd.normalize_str(c) == ud.normalize("NFD", c), f"U+{cp:04X}"
            nfd[cp] = [ord(x) for x in ud.normalize("NFD", c)]
            parts = [int(x, 16) for x in d.split()]
            if len(parts) == 2 and ud.normalize("NFC", c) == c:
                pairs[(parts[0], parts[1])] = cp
    # the crate's own table sizes (unicode-normalization-alignments 0.1.12, Unicode 9.0)
    assert (len(ccc), len(nfd), len(pairs)) == (814, 2060, 940), (len(ccc), len(nfd), len(pairs))
    # what data/unicode_norm.cpp relies on: nothing below U+0300 has ccc != 0 or is the second
    # of a pair (so text below U+0300 is already NFC), at most 4 code points a decomposition
    assert min(ccc) >= 0x300 and min(b for _, b in pairs) >= 0x300
    assert max(len(v) for v in nfd.values()) <= 4
    ranges = []
    for cp in sorted(ccc):
        if ranges and ranges[-1][1] == cp - 1 and ranges[-1][2] == ccc[cp]:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp, ccc[cp]])
    return ranges, nfd, pairs


def write_norm_tables(tables, out):
    ranges, nfd, pairs = tables
    cps = sorted(nfd)
    starts, pool = [0], []
    for cp in cps:
        pool += nfd[cp]
        starts.append(len(pool))
    assert len(pool) < 65536
    keys = sorted(pairs)

    def rows(values, per_line=16):
        return ["  " + ",".join(values[i:i + per_line]) + "," for i in range(0, len(values), per_line)]

    lines = [
        "// Generated by scripts/gen_unicode_tables.py; do not edit. What canonical composition (NFC, UAX #15)",
        "// needs, for data/unicode_norm.cpp: the Unicode %s database restricted to what Hugging Face" % ud.unidata_version,
        "// tokenizers' NFC knows (Unicode 9.0). Hangul is arithmetic, not here.",
        "#pragma once",
        "#include <cstdint>",
        "",
        "namespace llmt {",
        "",
        "// canonical combining class != 0: {first, last, ccc}, sorted",
        "struct CccRange {",
        "  uint32_t first, last;",
        "  uint8_t ccc;",
        "};",
        "static const CccRange kCccRanges[%d] = {" % len(ranges),
    ]
    lines += rows(["{0x%X,0x%X,%d}" % tuple(r) for r in ranges], 8)
    lines += ["};", "",
              "// full canonical decomposition of kNfdCp[i] (sorted): kNfdPool[kNfdStart[i] .. kNfdStart[i + 1])",
              "static const uint32_t kNfdCp[%d] = {" % len(cps)]
    lines += rows(["0x%X" % cp for cp in cps])
    lines += ["};", "static const uint16_t kNfdStart[%d] = {" % len(starts)]
    lines += rows([str(x) for x in starts], 24)
    lines += ["};", "static const uint32_t kNfdPool[%d] = {" % len(pool)]
    lines += rows(["0x%X" % cp for cp in pool])
    lines += ["};", "",
              "// primary composites: kNfcPairs[i] = first << 21 | second (sorted) composes to kNfcComposite[i]",
              "static const uint64_t kNfcPairs[%d] = {" % len(keys)]
    lines += rows(["0x%X" % (a << 21 | b) for a, b in keys], 10)
    lines += ["};", "static const uint32_t kNfcComposite[%d] = {" % len(keys)]
    lines += rows(["0x%X" % pairs[k] for k in keys])
    lines += ["};", "", "}  // namespace llmt"]
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {out}: {len(ranges)} ccc ranges, {len(cps)} decompositions ({len(pool)} code points), "
          f"{len(keys)} composites", file=sys.stderr)


class NfcModel:
    """The composition data/unicode_norm.cpp runs, over the tables, in Python."""

    def __init__(self, tables):
        ranges, self.nfd, self.pairs = tables
        self.ccc = {cp: k for first, last, k in ranges for cp in range(first, last + 1)}

    def compose(self, a, b):
        if L_BASE <= a < L_BASE + 19 and V_BASE <= b < V_BASE + 21:
            return HANGUL_S + ((a - L_BASE) * 21 + b - V_BASE) * 28
        if HANGUL_S <= a < HANGUL_S + HANGUL_COUNT and (a - HANGUL_S) % 28 == 0 and T_BASE < b < T_BASE + 28:
            return a + b - T_BASE
        return self.pairs.get((a, b))

    def __call__(self, text):
        cc = self.ccc
        d = []
        for ch in text:
            cp = ord(ch)
            if HANGUL_S <= cp < HANGUL_S + HANGUL_COUNT:
                s = cp - HANGUL_S
                d += [L_BASE + s // 588, V_BASE + s % 588 // 28] + ([T_BASE + s % 28] if s % 28 else [])
            else:
                d += self.nfd.get(cp, [cp])
        for i in range(1, len(d)):  # canonical ordering: a stable insertion sort of each run of marks
            j = i
            while j > 0 and cc.get(d[j], 0) and cc.get(d[j - 1], 0) > cc.get(d[j], 0):
                d[j - 1], d[j] = d[j], d[j - 1]
                j -= 1
        out, starter, last = [], -1, 0
        for cp in d:
            k = cc.get(cp, 0)
            if starter >= 0 and (last == 0 or last < k):
                c = self.compose(out[starter], cp)
                if c is not None:
                    out[starter] = c
                    continue
            if k == 0:
                starter = len(out)
            last = k
            out.append(cp)
        return "".join(map(chr, out))


def verify_norm(tables):
    """The model against HF tokenizers' NFC (which must agree) and unicodedata2 16.0's (which may not)."""
    from tokenizers import normalizers
    hf = normalizers.NFC()
    model = NfcModel(tables)
    scalars = [chr(cp) for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    cases = set()
    for c in scalars:
        cases.update((c, ud.normalize("NFD", c), ud.normalize("NFC", c), "x" + PROBE_HI + c + PROBE_LO))
    firsts = sorted({chr(a) for a, _ in model.pairs})
    seconds = sorted({chr(b) for _, b in model.pairs})
    cases.update(a + b for a in firsts for b in seconds)
    jamo = [chr(c) for c in list(range(0x1100, 0x1100 + 20)) + list(range(0x1160, 0x1160 + 23)) + list(range(0x11A6, 0x11C4))]
    cases.update(a + b for a in jamo for b in jamo)
    cases.update(chr(s) + chr(t) for s in range(HANGUL_S, HANGUL_S + HANGUL_COUNT, 27) for t in range(T_BASE, T_BASE + 29))
    bad = differ = 0
    for text in sorted(cases):
        got, want = model(text), hf.normalize_str(text)
        if got != want:
            bad += 1
            if bad <= 20:
                print(f"{ascii(text)}: tables give {ascii(got)}, HF tokenizers {ascii(want)}", file=sys.stderr)
        differ += want != ud.normalize("NFC", text)
    print(f"verify: {len(cases)} NFC cases, {bad} differ from HF tokenizers "
          f"({differ} of HF's differ from unicodedata2 {ud.unidata_version})", file=sys.stderr)
    return bad == 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "data", "unicode_tables.h"))
    ap.add_argument("--norm-out", default=os.path.join(os.path.dirname(__file__), "..", "data",
                                                       "unicode_norm_tables.h"))
    ap.add_argument("--verify", action="store_true")
    args = ap.parse_args()
    assert ud.unidata_version == "16.0.0", f"need unicodedata2 16.0.0, have {ud.unidata_version}"
    cats = [category(cp) for cp in range(0x110000)]
    blocks, index, stage1 = [], {}, []
    for b in range(0x1100):
        packed = bytearray(64)
        for i in range(256):
            packed[i >> 2] |= cats[b * 256 + i] << ((i & 3) * 2)
        key = bytes(packed)
        if key not in index:
            index[key] = len(blocks)
            blocks.append(key)
        stage1.append(index[key])
    assert len(blocks) < 256
    lines = [
        "// Generated by scripts/gen_unicode_tables.py from the Unicode %s database; do not edit." % ud.unidata_version,
        "// Character classes of the pre-tokenizer regexes: 0 other, 1 \\p{L}, 2 \\p{N}, 3 \\s (White_Space).",
        "// class(cp) = (kUniBlocks[kUniStage1[cp >> 8]][(cp & 255) >> 2] >> ((cp & 3) * 2)) & 3",
        "#pragma once",
        "#include <cstdint>",
        "",
        "namespace llmt {",
        "",
        "static const uint8_t kUniStage1[0x1100] = {",
    ]
    for i in range(0, len(stage1), 32):
        lines.append("  " + ",".join(str(x) for x in stage1[i:i + 32]) + ",")
    lines.append("};")
    lines.append("")
    lines.append("static const uint8_t kUniBlocks[%d][64] = {" % len(blocks))
    for blk in blocks:
        lines.append("  {" + ",".join("0x%02x" % x for x in blk) + "},")
    lines.append("};")
    lines.append("")
    lines.append("}  // namespace llmt")
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}: {len(blocks)} blocks", file=sys.stderr)
    tables = norm_tables()
    write_norm_tables(tables, args.norm_out)
    if args.verify and not (verify(cats) & verify_norm(tables)):
        sys.exit(1)


if __name__ == "__main__":
    main()
