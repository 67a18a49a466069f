# Sourced by the LoRA scripts once their own checks are done: py= a Python that imports peft, torch
# and transformers ($LLMT_PEFT_PYTHON, else /tmp/lora-venv's, else python3); without one the script
# ends here, saying what was skipped ($peft_check: what the Python would have checked).
py=${LLMT_PEFT_PYTHON:-}
for cand in /tmp/lora-venv/bin/python python3; do
  [ -n "$py" ] && break
  command -v "$cand" > /dev/null && "$cand" -c "import peft, torch, transformers" 2> /dev/null && py=$cand
done
if [ -z "$py" ]; then
  echo "skipped: no Python with peft, torch and transformers ${peft_check:-for PeftModel.from_pretrained}"
  exit 0
fi
