#!/usr/bin/env python3
"""`dflex-data regenerate` on an untrained target made here (examples/default/make_target.py
--steps 0: a tokenizer with a chat template and random Qwen3 weights; nothing is downloaded):
the target answers each record's last user turn (earlier answers kept, the record's own last
answer replaced) with exactly what transformers' generate gives; the dataset is those
conversations trained on the new answer only; a run killed mid-way and run again, greedy and
sampled, ends with the journal and dataset of an uninterrupted run (nothing answered twice or
lost, a torn last line dropped); a journal of other settings, a record without a user turn and
a bad option exit 2 naming the problem. The helper's prompts are the chat template's.

usage: regenerate_test.py DFLEX_DATA MAKE_TARGET_PY"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

tool, make_target = os.path.abspath(sys.argv[1]), sys.argv[2]
helper = os.path.join(os.path.dirname(tool), "dflex-chat-helper.py")
work = tempfile.mkdtemp(prefix="dflex-data-regenerate-test-")


def check(condition, message):
    if not condition:
        print("FAILED:", message, file=sys.stderr)
        sys.exit(1)


def write_jsonl(name, records):
    path = os.path.join(work, name)
    with open(path, "w") as f:
        for record in records:
            f.write((record if isinstance(record, str) else json.dumps(record)) + "\n")
    return path


def regenerate(output, inputs, *options, timeout=300):
    return subprocess.run([tool, "regenerate", "--target", target, "--device", "cpu", "--batch-size", "3",
                           "--max-new-tokens", "12", *options, output, *inputs],
                          capture_output=True, text=True, timeout=timeout, cwd=work)


def journal_records(path):
    with open(path) as f:
        return [json.loads(line) for line in f.read().splitlines()]


def dump(directory):
    result = subprocess.run([tool, "dump", directory], capture_output=True, text=True, timeout=60)
    check(result.returncode == 0, "dump failed: " + result.stderr)
    return [json.loads(line) for line in result.stdout.splitlines()]


target = os.path.join(work, "target")
subprocess.run([sys.executable, make_target, "--out", target, "--steps", "0"], check=True,
               capture_output=True, timeout=300)

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

tokenizer = AutoTokenizer.from_pretrained(target)
model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()

questions = ["Count from 3 to 9.", "List the months from May to July.", "Say 'red' twice.",
             "Reverse the list: moon, star, sun.", "List the letters from c to h.",
             "Count by 5 from 10 to 40.", "Write the 3 times table up to 3 x 4."]
records = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": "old"}]}
           for q in questions]
records[1] = {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": questions[1]}]}
records[4] = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                           {"role": "user", "content": questions[4]}]}
prompt_turns = [[{"role": "user", "content": q}] for q in questions]
prompt_turns[1] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": questions[1]}]
prompt_turns[4] = records[4]["messages"]
# Three rounds of them, so that a run has batches left when it is killed after its first.
ROUNDS = 3
inputs = write_jsonl("prompts.jsonl", records[:4] + [""] + records[4:] + records * (ROUNDS - 1))
prompt_turns *= ROUNDS

# The helper's prompts: the chat template's rendering with the generation prompt.
result = subprocess.run([sys.executable, helper, "prompts", "--target", target, inputs],
                        capture_output=True, text=True, timeout=120)
check(result.returncode == 0, "prompts failed: " + result.stderr)
rendered = [json.loads(line) for line in result.stdout.splitlines()]
expected_prompts = [list(tokenizer.apply_chat_template(m, tokenize=True, add_generation_prompt=True,
                                                       return_dict=False)) for m in prompt_turns]
check([r["input_ids"] for r in rendered] == expected_prompts, "the prompts are not the chat template's")
check(rendered[4]["origin"].endswith("prompts.jsonl:6"), f"origin {rendered[4]['origin']}, expected line 6")

# An uninterrupted greedy run.
whole = os.path.join(work, "whole")
result = regenerate(whole, [inputs])
check(result.returncode == 0, "regenerate failed: " + result.stderr)
check(f"wrote {len(prompt_turns)} samples" in result.stdout, result.stdout)
answers = journal_records(whole + ".journal.jsonl")
check(len(answers) == len(prompt_turns), f"{len(answers)} journal records for {len(prompt_turns)} prompts")
eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
for turns, record, ids in zip(prompt_turns, answers, expected_prompts):
    check(record["messages"][:-1] == turns, f"the journal's turns {record['messages'][:-1]} are not {turns}")
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=eos,
                             pad_token_id=tokenizer.pad_token_id)[0, len(ids):].tolist()
    expected = tokenizer.decode(out, skip_special_tokens=True)
    check(record["messages"][-1] == {"role": "assistant", "content": expected},
          f"answer {record['messages'][-1]!r}, transformers' greedy decoding gives {expected!r}")
samples = dump(whole)
for record, sample in zip(answers, samples):
    whole_ids = list(tokenizer.apply_chat_template(record["messages"], tokenize=True, return_dict=False))
    check(sample["input_ids"] == whole_ids, "the sample is not the regenerated conversation")
    masked = [t for t, bit in zip(sample["input_ids"], sample["loss_mask"]) if bit]
    check(tokenizer.decode(masked) == record["messages"][-1]["content"] + "<|im_end|>",
          f"the loss mask covers {tokenizer.decode(masked)!r}, not the new answer alone")

# Run again: everything is answered already; the dataset is written again, the same.
result = regenerate(whole, [inputs])
check(result.returncode == 0 and "answered already" in result.stderr, "a finished journal: " + result.stderr)
check(dump(whole) == samples, "a second run changed the dataset")


def interrupted(name, *options):
    """The journal and dataset of a run killed after its first batch, then run again."""
    output = os.path.join(work, name)
    process = subprocess.Popen([tool, "regenerate", "--target", target, "--device", "cpu", "--batch-size", "3",
                                "--max-new-tokens", "12", *options, output, inputs],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=work,
                               start_new_session=True)
    journal = output + ".journal.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        if os.path.exists(journal) and len(journal_records(journal)) >= 3:
            break
        time.sleep(0.01)
    if process.poll() is not None:
        check(False, "the run ended before it could be killed: " + process.stderr.read().decode())
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    done = len(journal_records(journal))
    check(3 <= done < len(prompt_turns), f"{done} records in the journal of the killed run")
    # A write cut short: half a record at the end.
    with open(journal, "a") as f:
        f.write('{"messages": [{"role": "user", "content": "tor')
    result = regenerate(output, [inputs], *options)
    check(result.returncode == 0, "the resumed run failed: " + result.stderr)
    check(f"resuming after {done - done % 3} of {len(prompt_turns)}" in result.stderr,
          "no resume message: " + result.stderr)
    return journal_records(output + ".journal.jsonl"), dump(output)


check(interrupted("greedy") == (answers, samples), "a killed and resumed run differs from an uninterrupted one")
sampled = os.path.join(work, "sampled")
result = regenerate(sampled, [inputs], "--temperature", "1.5", "--seed", "7")
check(result.returncode == 0, "sampled regenerate failed: " + result.stderr)
sampled_answers = journal_records(sampled + ".journal.jsonl")
check(sampled_answers != answers, "sampling at temperature 1.5 gave the greedy answers")
check(interrupted("sampled-resumed", "--temperature", "1.5", "--seed", "7") == (sampled_answers, dump(sampled)),
      "a killed and resumed sampled run differs from an uninterrupted one")

# The journal of other settings is refused, naming them; nothing is written.
result = regenerate(whole, [inputs], "--max-new-tokens", "5")
check(result.returncode == 2 and "max_new_tokens" in result.stderr and "other settings" in result.stderr,
      f"a journal of other settings: exit {result.returncode}: {result.stderr}")
# A record without a user turn to answer, named by its line.
bad = write_jsonl("bad.jsonl", [records[0], {"messages": [{"role": "system", "content": "Hi"}]}])
result = regenerate(os.path.join(work, "bad-out"), [bad])
check(result.returncode == 2 and "bad.jsonl:2" in result.stderr and "no user turn" in result.stderr,
      f"a record without a user turn: exit {result.returncode}: {result.stderr}")
check(not os.path.exists(os.path.join(work, "bad-out")), "a failed run left its output directory")
result = regenerate(os.path.join(work, "bad-out"), [inputs], "--top-p", "0")
check(result.returncode == 2 and "--top-p" in result.stderr, f"--top-p 0: exit {result.returncode}: {result.stderr}")
result = subprocess.run([tool, "regenerate", "--target", target, "--batch-size"], capture_output=True, text=True)
check(result.returncode == 2 and "--batch-size" in result.stderr, "a missing value: " + result.stderr)
print("regenerate_test: ok")
