#!/usr/bin/env bash
# llmt's tokenizer against tiktoken and sentencepiece on the real vocabularies PyPI wheels carry
# (llama-models: Meta's Llama 3 and 4 tokenizer.model; mistral-common: Mistral's SentencePiece v1,
# v2, v3, v7 and tekken files), on the shared data's text: tests/reference/compare_real_vocabularies.py.
# Skipped (77) with a message when the packages (pip install -r scripts/requirements-tests.txt) or the
# shared data are missing. LLMT_TEST_PYTHON names another interpreter (a virtual environment's).
# Usage: real_vocabularies.sh path/to/llmt path/to/repo
set -uo pipefail
exec "${LLMT_TEST_PYTHON:-python3}" "$2/tests/reference/compare_real_vocabularies.py" "$1"
