#!/usr/bin/env python3
"""Records Hugging Face tokenizers' NFC normalizer (what Qwen2's tokenizer.json names) on hard cases,
for tests/data/test_unicode_norm.cpp. Writes tests/reference/tokenizers/nfc_cases.json.

    pip install unicodedata2==16.0.0 tokenizers
    python3 tests/reference/make_nfc_fixtures.py

Each case is [input, expected]: the expected text is `tokenizers.normalizers.NFC().normalize_str`
of the input, cross-checked against unicodedata2 16.0's NFC. tokenizers' NFC carries Unicode 9.0
tables (its crate unicode-normalization-alignments 0.1.12), so where Unicode added marks or
composites since, the two disagree; tokenizers is the peer llmt matches, so its answer is the
expected one and every disagreement is listed in the fixture's "disagreements".

Groups:
  codepoints  every code point (Unicode 16.0) with a nonzero combining class, a canonical
              decomposition, or in a primary composite pair, alone, in NFD and in NFC; each mark
              also between a class-240 and a class-1 mark after "a" (where canonical ordering puts it)
  hangul      LV syllables, every 7th LVT, decomposed; jamo edge cases; seeded random jamo strings
  random      seeded random strings of starters and marks from several scripts
  nfc_text    sentences already in NFC (expected unchanged) and their NFD forms
  tokenizer   a tiny byte-level BPE tokenizer.json with Qwen2's normalizer and pre-tokenizer and
              added tokens normalized and not, and the ids tokenizers gives for some strings
"""
import json
import os
import random

import tokenizers
import unicodedata2 as ud
from tokenizers import Tokenizer, normalizers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "tokenizers", "nfc_cases.json")

HF = normalizers.NFC()
HANGUL_S, HANGUL_COUNT = 0xAC00, 11172
L_BASE, V_BASE, T_BASE = 0x1100, 0x1161, 0x11A7
QWEN2_PAT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
             r"""|\s+(?!\S)|\s+""")

disagreements = []


def case(text):
    want = HF.normalize_str(text)
    ref = ud.normalize("NFC", text)
    if want != ref:
        disagreements.append({"input": text, "tokenizers": want, "unicodedata2": ref})
    return [text, want]


def cases(texts):
    seen, out = set(), []
    for t in texts:
        if t not in seen:
            seen.add(t)
            out.append(case(t))
    return out


def codepoints():
    texts = []
    for cp in range(0x300, 0x110000):  # nothing below U+0300 is a mark, nor changes under NFC alone
        if 0xD800 <= cp <= 0xDFFF or HANGUL_S <= cp < HANGUL_S + HANGUL_COUNT:
            continue
        c = chr(cp)
        d = ud.decomposition(c)
        if ud.combining(c):
            texts.append("a\u0345" + c + "\u0334")
        if (d and not d.startswith("<")) or ud.combining(c):
            texts += [c, ud.normalize("NFD", c), ud.normalize("NFC", c)]
    # composites below U+0300 (À ...) and every first or second of a pair
    for cp in range(0xC0, 0x110000):
        if 0xD800 <= cp <= 0xDFFF or HANGUL_S <= cp < HANGUL_S + HANGUL_COUNT:
            continue
        c = chr(cp)
        d = ud.decomposition(c)
        if d and not d.startswith("<") and len(d.split()) == 2 and ud.normalize("NFC", c) == c:
            a, b = (chr(int(x, 16)) for x in d.split())
            texts += [c, ud.normalize("NFD", c), a + b, a, b]
    return cases(texts)


def hangul(rng):
    texts = []
    for s in range(HANGUL_S, HANGUL_S + HANGUL_COUNT):
        if (s - HANGUL_S) % 28 == 0 or (s - HANGUL_S) % 7 == 3:
            texts.append(ud.normalize("NFD", chr(s)))
    L, V, T = chr(L_BASE), chr(V_BASE), chr(T_BASE + 1)
    texts += [
        L, V, T, L + V, L + V + T, L + V + T + T, chr(0xAC00) + T, chr(0xAC01) + T,   # LV+T composes, LVT+T not
        chr(0xAC00) + chr(T_BASE), chr(0xAC00) + chr(T_BASE + 28),                  # not T jamo
        chr(L_BASE + 18) + chr(V_BASE + 20) + chr(T_BASE + 27), chr(L_BASE + 19) + V, L + chr(V_BASE + 21),
        L + "\u0301" + V, L + V + "\u0301" + T, L + L + V + V, "\u3131\u314F",          # a mark blocks; compat jamo
        "\u1113\u1161", "\u1100\u1176", "\ua960\u1161", "\u1100\ud7b0",                 # old jamo do not compose
        "한국어 텍스트", ud.normalize("NFD", "한국어 텍스트"),
    ]
    jamo = [chr(c) for c in list(range(0x1100, 0x1115)) + list(range(0x1160, 0x1178)) + list(range(0x11A6, 0x11C5))]
    jamo += ["\u0301", "\u0300", "a", "\uac00", "\uac01"]
    for _ in range(300):
        texts.append("".join(rng.choice(jamo) for _ in range(rng.randint(2, 8))))
    return cases(texts)


def random_strings(rng):
    marks16 = [chr(cp) for cp in range(0x300, 0x110000) if not 0xD800 <= cp <= 0xDFFF and ud.combining(chr(cp))]
    common = [chr(c) for c in list(range(0x300, 0x363)) + [0x5B0, 0x5B4, 0x5BC, 0x5C1, 0x5C2, 0x64B, 0x64E, 0x650, 0x651,
                                                        0x652, 0x653, 0x654, 0x655, 0x93C, 0x94D, 0x9BC, 0x9CD, 0xE48,
                                                        0xE49, 0x1DC0, 0x20D0, 0x302A, 0x3099, 0x309A]]
    scripts = {
        "latin": "aeiouyAEIOUYnNcCsSzZgGkK" + "éÅṩǖẫỆñçÇøß",
        "greek": "αεηιουωρΑΕΗΙΟΥΩ" + "ἀᾷῼΐ",
        "cyrillic": "еиоуаЕИОУАзжЗЖ" + "йёЙЁ",
        "devanagari": "कखगडढयफजऩ" + "\u093f\u0940\u094b",
        "bengali": "\u09ac\u09c7\u09be\u09d7\u09cb\u09a1",
        "tamil": "\u0b92\u0bc6\u0bbe\u0bd7\u0bc7\u0bca",
        "kannada": "\u0cbf\u0cc6\u0cd5\u0cd6\u0cc2\u0cca",
        "malayalam": "\u0d46\u0d3e\u0d57\u0d47\u0d4a",
        "sinhala": "\u0dd9\u0dcf\u0ddf\u0dca\u0ddc",
        "tibetan": "\u0f40\u0f71\u0f72\u0f74\u0f80\u0fb2\u0fb3",
        "hebrew": "אבשת",
        "arabic": "ال\u064aوه\u06c1\u06d2",
        "japanese": "かきくはひカキハ" + "がパ",
        "balinese": "\u1b05\u1b35\u1b07\u1b3a",
        "myanmar": "\u1025\u102e",
        "kaithi": "\U00011099\U0001109b\U000110a5\U000110ba",
        "chakma": "\U00011131\U00011132\U00011127",
        "grantha": "\U00011347\U0001133e\U00011357",
        "tirhuta": "\U000114b9\U000114ba\U000114b0\U000114bd",
        "siddham": "\U000115b8\U000115af\U000115b9",
        "dives_akuru": "\U00011935\U00011930",           # composes in Unicode 13, not in tokenizers
        "tulu_tigalari": "\U00011382\U000113c9\U000113c2",  # Unicode 16
        "kirat_rai": "\U00016d63\U00016d67",                 # Unicode 16
        "cjk": "中文字",
    }
    names = sorted(scripts)
    texts = []
    for _ in range(2500):
        pool = scripts[rng.choice(names)] + scripts[rng.choice(names)]
        s = []
        for _ in range(rng.randint(1, 10)):
            r = rng.random()
            s.append(rng.choice(pool) if r < 0.45 else rng.choice(common) if r < 0.8 else rng.choice(marks16))
        texts.append("".join(s))
    return cases(texts)


def nfc_text():
    sentences = [
        "Tiếng Việt có dấu: Chào thế giới, ngôn ngữ đẹp.", "Ça déménage à l'hôtel où naïve Zoë dîne.",
        "Größe, Übermaß und Äpfel", "Ἐν ἀρχῇ ἦν ὁ λόγος, καὶ ὁ λόγος ἦν πρὸς τὸν θεόν", "Ёлка и йогурт",
        "한국어 텍스트와 한글", "हिन्दी में लिखा गया क़िस्सा", "بِسْمِ ٱللَّٰهِ ٱلرَّحْمَٰنِ ٱلرَّحِيمِ", "בְּרֵאשִׁית בָּרָא אֱלֹהִים",
        "がぎぐげご パピプペポ", "ফ্রেঞ্চ কোয়ালিটি", "தமிழ் மொழி கொண்டு", "ಕನ್ನಡ ಕೊಡು", "മലയാളം കൊടു",
        "ශ්‍රී ලංකා කොළඹ", "བོད་སྐད་ཀྱི་ཡི་གེ", "ﬁ ① ㎏ ｶ Å Ω", "👍🏽 👨‍👩‍👧 🏳️‍🌈", "plain ASCII text, nothing to do",
        "e\u0301\u0323 q\u0307\u0323 ẹ́ Å", "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇",
    ]
    texts = []
    for s in sentences:
        nfc = HF.normalize_str(s)
        texts += [nfc, ud.normalize("NFD", s), s]
    return cases(texts)


def bytes_to_unicode():
    """GPT-2's: the character that stands for each byte in a byte-level vocabulary."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = bytes_to_unicode()


def byte_level(text):
    return "".join(B2U[b] for b in text.encode())


def tokenizer_fixture():
    """A tiny Qwen2-shaped tokenizer.json: NFC, Split(Qwen2) + ByteLevel, a merge making "é"."""
    vocab = {B2U[b]: b for b in range(256)}
    merges = [[byte_level("é")[0], byte_level("é")[1]], [byte_level(" ")[0], byte_level("é")]]
    vocab[byte_level("é")] = 256
    vocab[byte_level(" é")] = 257
    added = [
        {"id": 258, "content": "<|endoftext|>", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True},
        {"id": 259, "content": "<e\u0301>", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": True, "special": False},   # matched in NFC text as "<é>"
        {"id": 260, "content": "[e\u0301]", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": False},  # matched only as written, before normalizing
    ]
    j = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_PAT}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    tok = Tokenizer.from_str(json.dumps(j))
    texts = ["é", "e\u0301", " e\u0301 é", "Cafe\u0301<|endoftext|>e\u0301", "<e\u0301> <é>", "[e\u0301] [é]",
             "e<|endoftext|>\u0301", "e[e\u0301]\u0301", "a\u0323\u0301 ẹ́ 한국어 " + ud.normalize("NFD", "한국어"),
             "\u0301leading", "x" * 3 + "e\u0301" * 3]
    encoded = []
    for t in texts:
        encoded.append({"text": t, "ids": tok.encode(t, add_special_tokens=False).ids})
    return {"tokenizer_json": j, "encode": encoded}


def main():
    assert ud.unidata_version == "16.0.0", f"need unicodedata2 16.0.0, have {ud.unidata_version}"
    rng = random.Random(20240615)
    groups = {
        "codepoints": codepoints(),
        "hangul": hangul(rng),
        "random": random_strings(rng),
        "nfc_text": nfc_text(),
    }
    for inp, want in groups["nfc_text"]:
        if inp == HF.normalize_str(inp):
            assert want == inp
    fx = {
        "made_by": "tests/reference/make_nfc_fixtures.py",
        "tokenizers": tokenizers.__version__,
        "unicodedata2": ud.unidata_version,
        "note": ("expected = tokenizers.normalizers.NFC().normalize_str(input). tokenizers' NFC has Unicode 9.0 "
                 "tables, so it leaves marks added since as starters (no reordering) and does not compose pairs "
                 "added since; each case where it differs from unicodedata2 16.0 is in disagreements, with "
                 "tokenizers' answer taken as the expected one"),
        "groups": groups,
        "disagreements": disagreements,
        "tokenizer": tokenizer_fixture(),
    }
    # one case a line: raw UTF-8 (marks as themselves keep the file small), JSON escapes for controls
    def dump(v):
        return json.dumps(v, ensure_ascii=False)

    parts = []
    for k, v in fx.items():
        if k == "groups":
            body = ",\n".join("%s: [\n%s\n]" % (dump(g), ",\n".join(map(dump, cs))) for g, cs in v.items())
            parts.append('"groups": {\n%s\n}' % body)
        elif k == "disagreements":
            parts.append('"disagreements": [\n%s\n]' % ",\n".join(map(dump, v)))
        else:
            parts.append("%s: %s" % (dump(k), dump(v)))
    text = "{\n" + ",\n".join(parts) + "\n}"
    assert json.loads(text) == fx
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    n = sum(len(g) for g in groups.values())
    print(f"wrote {OUT}: {n} cases, {len(disagreements)} where tokenizers differs from unicodedata2, "
          f"{len(text.encode()) // 1024} KB")


if __name__ == "__main__":
    main()
