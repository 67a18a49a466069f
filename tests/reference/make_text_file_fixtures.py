#!/usr/bin/env python3
"""Reference texts for run_clm's --train_file types (data/text_files.h), made with the `datasets` loaders
that run_clm.py calls: load_dataset("json" | "csv" | "text", data_files=...), the column run_clm
tokenizes ("text" if present, else the first), each record's value as Python gives it.

    pip install datasets
    python3 tests/reference/make_text_file_fixtures.py

Writes the sample files and tests/reference/text_files/expected.json (committed): for each file,
the list of texts, and for the .txt file the lines with keep_linebreaks True and False.
"""
import json
import os

import datasets

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "text_files")

SAMPLES = {
    # JSON Lines with "text" not first, unicode, escapes, a blank line, an extra field in one record
    "records.jsonl": '{"id": 1, "text": "first line\\nsecond line"}\n'
                     '{"id": 2, "text": "caf\\u00e9 \\"quoted\\" \\t tab"}\n'
                     '\n'
                     '{"id": 3, "text": "", "extra": true}\n',
    # one JSON array of objects without a "text" field: the first column
    "array.json": '[{"content": "alpha", "label": 0}, {"content": "beta gamma", "label": 1}]\n',
    # CSV with quoted commas, doubled quotes, a newline inside quotes, CRLF endings, "text" second
    "rows.csv": 'id,text,note\r\n'
                '1,plain words,a\r\n'
                '2,"with, a comma",b\r\n'
                '3,"say ""hi"" now",c\r\n'
                '4,"two\nlines",d\r\n',
    # CSV without a "text" column: the first
    "first.csv": 'body,n\nhello there,1\n"x, y",2\n',
    # plain text: lines with and without breaks
    "lines.txt": "one\ntwo  \n\nthree\r\nfour",
}


def texts(builder, path, **kw):
    ds = datasets.load_dataset(builder, data_files=path, split="train", **kw)
    column = "text" if "text" in ds.column_names else ds.column_names[0]
    return [str(v) for v in ds[column]]


def main():
    os.makedirs(OUT, exist_ok=True)
    expected = {}
    for name, content in SAMPLES.items():
        path = os.path.join(OUT, name)
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(content)
        ext = name.rsplit(".", 1)[1]
        if ext == "txt":
            expected[name] = {"keep_linebreaks": texts("text", path, keep_linebreaks=True),
                              "no_linebreaks": texts("text", path, keep_linebreaks=False)}
        else:
            expected[name] = texts("json" if ext in ("json", "jsonl") else "csv", path)
    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"datasets": datasets.__version__, "files": expected}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(json.dumps(expected, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
