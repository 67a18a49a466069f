#!/usr/bin/env python3
"""Tiny tokenizers laid out as Llama 3.x, Qwen2/Qwen2.5, Qwen3, Mistral and Gemma 2/3 checkpoints ship theirs, and what
Hugging Face's AutoTokenizer makes of them, for tests/data/test_tokenizers_family.cpp (and, through
make_dataset_fixtures.py, the Alpaca and WikiText batches of tests/data/test_datasets.cpp).

    pip install tokenizers transformers sentencepiece protobuf unicodedata2
    python3 tests/reference/make_family_tokenizers.py     # reads $LLMT_TEST_DATA or ../shared/data

The real vocabularies are 128k-262k tokens and are not in the shared data (Gemma's and Qwen3's are
gated or unreachable here, and no installed package ships them), so each family gets a
1000-token vocabulary trained here on Tiny Shakespeare with that family's pipeline, and the file
layout, special tokens and tokenizer_config.json of its published checkpoints:
  llama3/   tokenizer.json: BPE (ignore_merges), Sequence[Split(LLaMA-3 regex), ByteLevel], post-processor
            Sequence[ByteLevel, TemplateProcessing(<|begin_of_text|> $A)]; the 256 Llama 3.1 special
            tokens after the vocabulary (<|begin_of_text|> = 1000 as 128000 in the real one);
            tokenizer_config.json: PreTrainedTokenizerFast, bos <|begin_of_text|>, eos <|end_of_text|>
            (meta-llama/Llama-3.1-8B)
  qwen2/    tokenizer.json: NFC normalizer, Sequence[Split(Qwen2 regex), ByteLevel], post-processor ByteLevel,
            <|endoftext|> <|im_start|> <|im_end|> after the vocabulary; tokenizer_config.json: Qwen2Tokenizer,
            bos null, eos <|endoftext|> (Qwen/Qwen2.5-0.5B)
  mistral/  tokenizer.model: a SentencePiece BPE with byte fallback and [INST] [/INST] control pieces;
            tokenizer.json as transformers converts it (Metaspace, prepend_scheme first);
            tokenizer_config.json: LlamaTokenizer, add_bos_token true, add_eos_token false
            (mistralai/Mistral-7B-v0.3)
  qwen3/    qwen2's vocabulary and pipeline with the 26 added tokens of Qwen3 (ids 1000..1025 as
            151643..151668): <|endoftext|> <|im_start|> <|im_end|> ... special, <tool_call> </tool_call>
            <|fim_*|> <|repo_name|> <|file_sep|> <tool_response> </tool_response> <think> </think> not
            special; tokenizer_config.json: Qwen2Tokenizer, bos null, eos <|im_end|> (Qwen/Qwen3-0.6B;
            the -Base checkpoints name <|endoftext|>)
  gemma/    tokenizer.model: a SentencePiece BPE as Gemma's (byte fallback, split digits, no dummy prefix,
            identity normalization) with <pad> <eos> <bos> <unk> = 0 1 2 3 as in the real one, <mask> = 4
            and <start_of_turn> <end_of_turn> = 5 6 (106 107 in Gemma 2, 105 106 in Gemma 3);
            tokenizer.json as transformers converts it (normalizer Replace(" ", "▁"), pre-tokenizer
            Split(" ", merged_with_previous), no Metaspace, decoder Replace ByteFallback Fuse, <bos> template);
            tokenizer_config.json: GemmaTokenizer, add_bos_token true, add_eos_token false (google/gemma-2-2b)
Writes tests/reference/tokenizers_family/<family>/ and tests/reference/tokenizers_family/cases.json:
per family the BOS/EOS ids AutoTokenizer reports, and for the hard strings of make_tokenizer_fixtures.py
plus Unicode-normalization cases: ids without and with the default special tokens, and the backend's
decode of those ids (for the family's own strings of EXTRA also the decode that skips special tokens);
for Mistral and Gemma also the sentencepiece library's ids from tokenizer.model. Corpora:
FNV-1a 64 of every string's ids each followed by -1, as make_tokenizer_fixtures.py.
"""
import json
import os
import struct
import sys
import tempfile

import sentencepiece as spm
import tokenizers
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_tokenizer_fixtures import DATA, HARD, LLAMA3_PAT, alpaca_strings, fnv, lines_of  # noqa: E402

OUT = os.path.join(HERE, "tokenizers_family")
QWEN2_PAT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
VOCAB = 1000

# the 256 special tokens of Llama 3.1 (meta-llama/Llama-3.1-8B tokenizer.json, ids 128000..128255)
LLAMA31_SPECIALS = (["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                     "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                     "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
                    + ["<|reserved_special_token_%d|>" % i for i in range(3, 248)])
QWEN2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen3's added tokens (Qwen/Qwen3-0.6B tokenizer.json, ids 151643..151668) and whether each is special
QWEN3_ADDED = ([(t, True) for t in QWEN2_SPECIALS + [
    "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]]
               + [(t, False) for t in ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
                                       "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
                                       "<tool_response>", "</tool_response>", "<think>", "</think>"]])

# strings whose NFC differs from the text (Qwen2 normalizes; the others must not)
NFC_CASES = ["e\u0301", "Cafe\u0301 cafe\u0301", "a\u0308\u0304 A\u030a\u0301", "\u1100\u1161\u11a8 \u1112\u1161\u11ab",
             "\u212b \u2126 \u0958", "o\u0323\u0302 o\u0302\u0323", "\u0301 leading", "<|endoftext|>e\u0301",
             "e\u0301<|im_start|>\u0301", "\ufb01 \u00bd \u2460 compat stays"]

# each family's own special tokens in text (recorded with the decode that skips special tokens too)
EXTRA = {
    "qwen3": ["<|im_start|>assistant\n<think>\nHmm, thou art.\n</think>\n\nYes.<|im_end|>\n",
              "<think></think>", "<think>\n\n</think>\n\n", " <think> x </think> ", "<thinking>", "</think",
              "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "<tool_response>ok</tool_response><|endoftext|>",
              "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>", "<|vision_start|><|image_pad|><|vision_end|>"],
    "gemma": ["<bos>Hello<eos>", "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
              " <start_of_turn> x", "<pad><unk><mask>", "<bos", "<start_of_turn<end_of_turn>>", "\t<0x09>\t",
              "<0xE2><0x96><0x81> \u2581 \u2581\u2581x", "x\u2581\u2581 y"],
}


def train_bpe(normalizer, pattern):
    tok = Tokenizer(models.BPE(ignore_merges=pattern == LLAMA3_PAT))
    if normalizer:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([os.path.join(DATA, "tinyshakespeare", "input.txt")], tr)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    return tok


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1 if path.endswith("config.json") else None)
        f.write("\n")


def make_llama3(d):
    tok = train_bpe(None, LLAMA3_PAT)
    tok.add_special_tokens(LLAMA31_SPECIALS)
    assert tok.token_to_id("<|begin_of_text|>") == VOCAB
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", VOCAB)])])
    tok.save(os.path.join(d, "tokenizer.json"))
    write_json(os.path.join(d, "tokenizer_config.json"), {
        "bos_token": "<|begin_of_text|>", "clean_up_tokenization_spaces": True, "eos_token": "<|end_of_text|>",
        "model_input_names": ["input_ids", "attention_mask"], "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast"})


def make_qwen2(d):
    tok = train_bpe(normalizers.NFC(), QWEN2_PAT)
    tok.add_special_tokens(QWEN2_SPECIALS)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.save(os.path.join(d, "tokenizer.json"))
    write_json(os.path.join(d, "tokenizer_config.json"), {
        "add_prefix_space": False, "bos_token": None, "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>", "errors": "replace", "model_max_length": 131072, "pad_token": "<|endoftext|>",
        "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None})


def make_mistral(d):
    text = open(os.path.join(DATA, "tinyshakespeare", "input.txt"), encoding="utf-8").read()
    tmp = tempfile.mkdtemp()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text.split("\n")), model_prefix=os.path.join(tmp, "tokenizer"), vocab_size=VOCAB,
        model_type="bpe", byte_fallback=True, character_coverage=1.0, split_digits=True,
        allow_whitespace_only_pieces=True, remove_extra_whitespaces=False, normalization_rule_name="identity",
        control_symbols=["[INST]", "[/INST]"], minloglevel=2)
    config = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "clean_up_tokenization_spaces": False,
              "eos_token": "</s>", "legacy": False, "model_max_length": 1000000000000000019884624838656,
              "spaces_between_special_tokens": False, "tokenizer_class": "LlamaTokenizer", "unk_token": "<unk>",
              "use_default_system_prompt": False}
    os.replace(os.path.join(tmp, "tokenizer.model"), os.path.join(d, "tokenizer.model"))
    write_json(os.path.join(d, "tokenizer_config.json"), config)
    # transformers converts tokenizer.model; keep the tokenizer.json it writes
    AutoTokenizer.from_pretrained(d).save_pretrained(tmp)
    with open(os.path.join(tmp, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    # the control pieces are special added tokens, as in the real file
    have = {t["content"] for t in tj["added_tokens"]}
    for piece in ("[INST]", "[/INST]"):
        assert piece in have, f"{piece} is not an added token of the converted tokenizer.json"
    write_json(os.path.join(d, "tokenizer.json"), tj)


def make_qwen3(d):
    tok = train_bpe(normalizers.NFC(), QWEN2_PAT)
    tok.add_tokens([tokenizers.AddedToken(t, special=sp, normalized=False) for t, sp in QWEN3_ADDED])
    for i, (t, sp) in enumerate(QWEN3_ADDED):
        assert tok.token_to_id(t) == VOCAB + i, t
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.save(os.path.join(d, "tokenizer.json"))
    write_json(os.path.join(d, "tokenizer_config.json"), {
        "add_bos_token": False, "add_prefix_space": False, "bos_token": None, "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": 131072, "pad_token": "<|endoftext|>",
        "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None})


def make_gemma(d):
    text = open(os.path.join(DATA, "tinyshakespeare", "input.txt"), encoding="utf-8").read()
    tmp = tempfile.mkdtemp()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text.split("\n")), model_prefix=os.path.join(tmp, "tokenizer"), vocab_size=VOCAB,
        model_type="bpe", byte_fallback=True, character_coverage=1.0, split_digits=True,
        allow_whitespace_only_pieces=True, remove_extra_whitespaces=False, normalization_rule_name="identity",
        add_dummy_prefix=False, pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>",
        bos_piece="<bos>", unk_piece="<unk>", control_symbols=["<mask>"],
        user_defined_symbols=["<start_of_turn>", "<end_of_turn>"], minloglevel=2)
    config = {"add_bos_token": True, "add_eos_token": False,
              "additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"],
              "bos_token": "<bos>", "clean_up_tokenization_spaces": False, "eos_token": "<eos>",
              "model_max_length": 1000000000000000019884624838656, "pad_token": "<pad>", "sp_model_kwargs": {},
              "spaces_between_special_tokens": False, "tokenizer_class": "GemmaTokenizer", "unk_token": "<unk>",
              "use_default_system_prompt": False}
    os.replace(os.path.join(tmp, "tokenizer.model"), os.path.join(d, "tokenizer.model"))
    write_json(os.path.join(d, "tokenizer_config.json"), config)
    if os.path.exists(os.path.join(d, "tokenizer.json")):
        os.remove(os.path.join(d, "tokenizer.json"))  # convert from tokenizer.model, not an older run's file
    AutoTokenizer.from_pretrained(d).save_pretrained(tmp)
    with open(os.path.join(tmp, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    # Gemma's pipeline, as transformers 5 builds it for GemmaTokenizer
    assert tj["normalizer"] == {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}, tj["normalizer"]
    assert tj["pre_tokenizer"] == {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                                   "invert": False}, tj["pre_tokenizer"]
    assert [d_["type"] for d_ in tj["decoder"]["decoders"]] == ["Replace", "ByteFallback", "Fuse"], tj["decoder"]
    assert tj["model"]["byte_fallback"] and tj["post_processor"]["special_tokens"]["<bos>"]["ids"] == [2]
    specials = {t["content"]: t["id"] for t in tj["added_tokens"] if t["special"]}
    assert specials == {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4, "<start_of_turn>": 5,
                        "<end_of_turn>": 6}, specials
    write_json(os.path.join(d, "tokenizer.json"), tj)


def gemma_variants(d):
    """tokenizers' ids for gemma/tokenizer.json edited: without the pre-tokenizer (transformers 4 converted
    Gemma's with none; behind the normalizer, which leaves no space, the Split is a no-op, so these are the
    file's ids); without the normalizer (spaces stay, as <0x20> bytes); and without the normalizer with "▁"
    written as " " in every piece and merge, where the Split, which ends a word after each space, keeps
    " x" pieces from forming (checked here: the ids differ from those without the Split)."""
    with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    texts = HARD[:8] + ["a b  c   d", " x ", "Hello world\n  again", "\u2581 \u2581x"]
    spaced = dict(tj, normalizer=None, model=dict(
        tj["model"], vocab={k.replace("\u2581", " "): v for k, v in tj["model"]["vocab"].items()},
        merges=[[a.replace("\u2581", " "), b.replace("\u2581", " ")] for a, b in tj["model"]["merges"]]))
    out = {}
    for variant, edited in (("pre_tokenizer_null", dict(tj, pre_tokenizer=None)),
                            ("normalizer_null", dict(tj, normalizer=None)), ("spaces_in_pieces", spaced)):
        tok = Tokenizer.from_str(json.dumps(edited))
        out[variant] = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in texts]
    unsplit = Tokenizer.from_str(json.dumps(dict(spaced, pre_tokenizer=None)))
    differ = sum(unsplit.encode(r["text"], add_special_tokens=False).ids != r["ids"] for r in out["spaces_in_pieces"])
    assert differ >= 5, f"the Split changes only {differ} strings of spaces_in_pieces"
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    makers = {"llama3": make_llama3, "qwen2": make_qwen2, "mistral": make_mistral, "qwen3": make_qwen3,
              "gemma": make_gemma}
    out = {"generated_by": "tests/reference/make_family_tokenizers.py",
           "versions": {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__,
                        "sentencepiece": spm.__version__},
           "families": {}}
    corpora = [("tinyshakespeare/input.txt", "lines"), ("alpaca/alpaca_seed_tasks.json", "fields"),
               ("alpaca/gpteacher-codegen.json", "fields")]
    texts_of = {rel: lines_of(os.path.join(DATA, rel)) if unit == "lines" else alpaca_strings(os.path.join(DATA, rel))
                for rel, unit in corpora}
    for name, make in makers.items():
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        make(d)
        tok = AutoTokenizer.from_pretrained(d)
        fam = {"class": type(tok).__name__, "bos_id": tok.bos_token_id, "eos_id": tok.eos_token_id,
               "vocab_size": len(tok), "hard": [], "corpora": []}
        sp = (spm.SentencePieceProcessor(model_file=os.path.join(d, "tokenizer.model"))
              if name in ("mistral", "gemma") else None)
        for text in HARD + NFC_CASES + EXTRA.get(name, []):
            ids = tok(text, add_special_tokens=False).input_ids
            rec = {"text": text, "ids": ids, "ids_specials": tok(text).input_ids,
                   "decoded": tok.backend_tokenizer.decode(ids, skip_special_tokens=False)}
            if text in EXTRA.get(name, []):
                rec["decoded_skip_special"] = tok.backend_tokenizer.decode(ids, skip_special_tokens=True)
            if sp:
                rec["sentencepiece"] = sp.encode(text)
            fam["hard"].append(rec)
        for rel, unit in corpora:
            ids = tok(texts_of[rel], add_special_tokens=False).input_ids
            h, total = 0xCBF29CE484222325, 0
            for i in ids:
                h = fnv(i + [-1], h)
                total += len(i)
            fam["corpora"].append({"corpus": rel, "unit": unit, "count": len(ids), "tokens": total, "fnv64": "%016x" % h})
        if name == "gemma":
            fam["variants"] = gemma_variants(d)
        out["families"][name] = fam
        print(f"{name}: {fam['class']}, {fam['vocab_size']} tokens, bos {fam['bos_id']}, eos {fam['eos_id']}, "
              f"'Hello world' -> {tok('Hello world').input_ids}", file=sys.stderr)
    write_json(os.path.join(OUT, "cases.json"), out)
    print("wrote", os.path.relpath(os.path.join(OUT, "cases.json")), os.path.getsize(os.path.join(OUT, "cases.json")),
          "bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
