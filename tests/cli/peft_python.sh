# Sourced by the LoRA scripts: py= a Python that imports peft, torch and transformers
# ($LLMT_PEFT_PYTHON, else /tmp/lora-venv's, else python3), or empty when there is none.
py=${LLMT_PEFT_PYTHON:-}
for cand in /tmp/lora-venv/bin/python python3; do
  [ -n "$py" ] && break
  command -v "$cand" > /dev/null && "$cand" -c "import peft, torch, transformers" 2> /dev/null && py=$cand
done
