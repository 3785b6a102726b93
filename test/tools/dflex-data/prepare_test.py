#!/usr/bin/env python3
"""`dflex-data prepare` on a tiny target built here (a byte-level BPE tokenizer with ChatML special
tokens and a Qwen-style chat template, a Qwen3 config.json; nothing is downloaded): OpenAI and
ShareGPT records give the same dataset, whose loss mask covers exactly each assistant turn's
content and its <|im_end|>; --last-turn-only masks the last answer only; --max-length cuts samples
and skips those left without assistant tokens; malformed records exit 2 naming input.jsonl:LINE
and leave no dataset.json (nor shards, nor a directory the run created) behind; ids outside the
config's vocabulary, a template that does not render turns as prefixes and a target without
config.json are errors.

usage: prepare_test.py DFLEX_DATA"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

tool = os.path.abspath(sys.argv[1])
helper = os.path.join(os.path.dirname(os.path.abspath(tool)), "dflex-chat-helper.py")
work = tempfile.mkdtemp(prefix="dflex-data-prepare-test-")

CHATML = ("{%- for message in messages %}"
          "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
          "{%- endfor %}"
          "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def check(condition, message):
    if not condition:
        print("FAILED:", message, file=sys.stderr)
        sys.exit(1)


def make_target(directory, chat_template, vocab_size=320):
    """A target directory: tokenizer files with `chat_template` and a Qwen3 config.json."""
    corpus = ["You are a concise assistant. What is the capital of France? Paris is the capital "
              "of France. Is it large? Yes, about two million people live in Paris."] * 8
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>",
                                      pad_token="<|endoftext|>",
                                      additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    wrapped.chat_template = chat_template
    wrapped.save_pretrained(directory)
    config = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": vocab_size,
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "torch_dtype": "float32", "eos_token_id": 2,
    }
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return wrapped


def write_jsonl(name, lines):
    path = os.path.join(work, name)
    with open(path, "w") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


def run(*args):
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=120, cwd=work)


def prepare(output, source, *options):
    return run("prepare", *options, output, source)


def dump(directory):
    result = run("dump", directory)
    check(result.returncode == 0, "dump failed: " + result.stderr)
    return [json.loads(line) for line in result.stdout.splitlines()]


def masked_spans(sample):
    """Maximal runs of 1s in the loss mask, as lists of ids."""
    spans, current = [], None
    for token, bit in zip(sample["input_ids"], sample["loss_mask"]):
        if bit:
            current = (current or []) + [token]
        elif current is not None:
            spans.append(current)
            current = None
    if current is not None:
        spans.append(current)
    return spans


target = os.path.join(work, "target")
tokenizer = make_target(target, CHATML)

# Conversations, in both formats; a content given as text parts, a multi-turn one.
conversations = [
    [("system", "You are a concise assistant."), ("user", "What is the capital of France?"),
     ("assistant", "Paris.")],
    [("user", "What is the capital of France?"), ("assistant", "Paris is the capital of France."),
     ("user", "Is it large?"), ("assistant", "Yes, about two million people live in Paris.")],
    [("system", "Answer in one word."), ("user", "Capital of France?"), ("assistant", "Paris")],
]
sharegpt_roles = {"system": "system", "user": "human", "assistant": "gpt"}
openai_records = []
for turns in conversations:
    messages = [{"role": role, "content": text} for role, text in turns]
    if turns is conversations[1]:  # the same text, as content parts
        answer = messages[1]["content"]
        messages[1]["content"] = [{"type": "text", "text": answer[:5]},
                                  {"type": "text", "text": answer[5:]}]
    openai_records.append({"messages": messages})
openai = write_jsonl("openai.jsonl", [openai_records[0], "", openai_records[1], openai_records[2]])
sharegpt = write_jsonl("sharegpt.jsonl", [
    {"conversations": [{"from": sharegpt_roles[role] if i % 2 else role, "value": text}
                       for role, text in turns]}
    for i, turns in enumerate(conversations)])

result = prepare(os.path.join(work, "openai-out"), openai, "--target", target)
check(result.returncode == 0, "prepare (OpenAI) failed: " + result.stderr)
check("wrote 3 samples" in result.stdout, result.stdout)
check("3 records, 0 samples skipped" in result.stderr, "no summary: " + result.stderr)
result = prepare(os.path.join(work, "sharegpt-out"), sharegpt, "--target", target, "--shard-tokens", "40")
check(result.returncode == 0, "prepare (ShareGPT) failed: " + result.stderr)
samples = dump(os.path.join(work, "openai-out"))
check(samples == dump(os.path.join(work, "sharegpt-out")),
      "OpenAI and ShareGPT records give different datasets")
check(len(json.load(open(os.path.join(work, "sharegpt-out", "dataset.json")))["shards"]) > 1,
      "--shard-tokens 40 wrote a single shard")
check(run("verify", os.path.join(work, "openai-out")).returncode == 0, "verify failed")

for turns, sample in zip(conversations, samples):
    messages = [{"role": role, "content": text} for role, text in turns]
    expected_ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
    check(sample["input_ids"] == list(expected_ids), "the ids are not the chat template's")
    answers = [text + "<|im_end|>" for role, text in turns if role == "assistant"]
    spans = [tokenizer.decode(span) for span in masked_spans(sample)]
    check(spans == answers, f"masked spans {spans!r}, expected {answers!r}")
    # Everything else, system and user turns included, is out of the mask.
    unmasked = tokenizer.decode([t for t, bit in zip(sample["input_ids"], sample["loss_mask"])
                                 if not bit])
    for role, text in turns:
        check((text in unmasked) == (role != "assistant"),
              f"{role} text {text!r} {'not ' if role != 'assistant' else ''}outside the mask")

# --last-turn-only: the last answer of each conversation.
result = prepare(os.path.join(work, "last-out"), openai, "--target", target, "--last-turn-only")
check(result.returncode == 0, "prepare --last-turn-only failed: " + result.stderr)
for turns, sample, full in zip(conversations, dump(os.path.join(work, "last-out")), samples):
    check(sample["input_ids"] == full["input_ids"], "--last-turn-only changed the ids")
    spans = [tokenizer.decode(span) for span in masked_spans(sample)]
    check(spans == [turns[-1][1] + "<|im_end|>"], f"--last-turn-only masked {spans!r}")

# --max-length: cut to N tokens; a record whose answers all lie past N is skipped and counted.
long_prompt = {"messages": [{"role": "system", "content": "You are a concise assistant. " * 6},
                            {"role": "user", "content": "Capital of France?"},
                            {"role": "assistant", "content": "Paris."}]}
cut = write_jsonl("cut.jsonl", [openai_records[1], long_prompt])
length = len(samples[1]["input_ids"]) - 5
result = prepare(os.path.join(work, "cut-out"), cut, "--target", target, "--max-length", str(length))
check(result.returncode == 0, "prepare --max-length failed: " + result.stderr)
check("2 records, 1 samples skipped" in result.stderr, "the skipped record is not counted: " + result.stderr)
cut_samples = dump(os.path.join(work, "cut-out"))
check(len(cut_samples) == 1, f"{len(cut_samples)} samples after --max-length, expected 1")
check(cut_samples[0]["input_ids"] == samples[1]["input_ids"][:length] and
      cut_samples[0]["loss_mask"] == samples[1]["loss_mask"][:length],
      "--max-length is not a prefix cut")

# A malformed record: exit 2 naming the line; nothing is left of the output (it held a dataset,
# and with one-token shards the first samples were already written when the error came).
bad_out = os.path.join(work, "bad-out")
shutil.copytree(os.path.join(work, "openai-out"), bad_out)
bad = write_jsonl("input.jsonl", [openai_records[0], openai_records[1], '{"messages": [}'])
result = prepare(bad_out, bad, "--target", target, "--shard-tokens", "1")
check(result.returncode == 2, f"a malformed line exited {result.returncode}: {result.stderr}")
check("input.jsonl:3" in result.stderr and "not JSON" in result.stderr, result.stderr)
check(not os.path.exists(os.path.join(bad_out, "dataset.json")), "dataset.json after a failure")
check(not [f for f in os.listdir(bad_out) if f.startswith("shard-")],
      f"shards left after a failure: {os.listdir(bad_out)}")

# An unknown role is named, with its line.
tool_role = write_jsonl("tool-role.jsonl", [openai_records[0], {"messages": [
    {"role": "user", "content": "Hi"}, {"role": "tool", "content": "{}"},
    {"role": "assistant", "content": "Hello"}]}])
result = prepare(os.path.join(work, "tool-out"), tool_role, "--target", target)
check(result.returncode == 2 and "tool-role.jsonl:2" in result.stderr and '"tool"' in result.stderr,
      f"unknown role: exit {result.returncode}: {result.stderr}")
check(not os.path.exists(os.path.join(work, "tool-out")), "a failed run left its output directory")

# The other malformed records, through the helper's own checks (no tokenizer needed).
spec = importlib.util.spec_from_file_location("chat_helper", helper)
chat_helper = importlib.util.module_from_spec(spec)
spec.loader.exec_module(chat_helper)
for record, problem in [
    ([1, 2], "expected a JSON object"),
    ({"text": "hello"}, 'no "messages" or "conversations"'),
    ({"messages": []}, '"messages" is empty'),
    ({"messages": [{"role": "user", "content": []}]}, "empty content list"),
    ({"messages": [{"role": "user", "content": "Hi"}]}, "no assistant turn"),
    ({"conversations": [{"from": "human", "value": "Hi"}, {"from": "bot", "value": "Yo"}]},
     'unknown role "bot"'),
    ({"messages": [{"role": "user"}]}, 'no "content"'),
]:
    try:
        chat_helper.messages_of(record)
        check(False, f"{record} was accepted")
    except chat_helper.RecordError as error:
        check(problem in str(error), f"{record}: {error}, expected {problem!r}")

# Ids outside the config's vocabulary: the record is named, nothing is written.
small = os.path.join(work, "small-vocab")
make_target(small, CHATML, vocab_size=100)
result = prepare(os.path.join(work, "small-out"), openai, "--target", small)
check(result.returncode == 1 and "openai.jsonl:1: token id" in result.stderr and
      "outside the vocabulary [0, 100)" in result.stderr, f"small vocabulary: {result.stderr}")
check(not os.path.exists(os.path.join(work, "small-out")), "a failed run left its output directory")

# A template whose partial renderings are not prefixes of the whole conversation.
counting = os.path.join(work, "counting")
make_target(counting, "{{- messages | length }}" + CHATML)
result = prepare(os.path.join(work, "counting-out"), openai, "--target", counting)
check(result.returncode == 1 and "openai.jsonl:1" in result.stderr and
      "does not render turns as prefixes" in result.stderr, f"non-prefix template: {result.stderr}")

# A template that renders the last assistant turn differently (a thinking block, as Qwen3's
# does): whole conversations are refused, --each-turn makes one sample per answer.
THINKING = ("{%- for message in messages %}"
            "{{- '<|im_start|>' + message.role + '\\n' }}"
            "{%- if message.role == 'assistant' and loop.last %}{{- '<think></think>' }}{%- endif %}"
            "{{- message.content + '<|im_end|>' + '\\n' }}"
            "{%- endfor %}"
            "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think></think>' }}{%- endif %}")
thinking = os.path.join(work, "thinking")
thinking_tokenizer = make_target(thinking, THINKING)
result = prepare(os.path.join(work, "thinking-out"), openai, "--target", thinking)
check(result.returncode == 1 and "does not render turns as prefixes" in result.stderr,
      f"thinking template, whole conversations: {result.stderr}")
result = prepare(os.path.join(work, "thinking-out"), openai, "--target", thinking, "--each-turn")
check(result.returncode == 0, f"--each-turn failed: {result.stderr}")
per_turn = dump(os.path.join(work, "thinking-out"))
answers = [text for turns in conversations for role, text in turns if role == "assistant"]
check(len(per_turn) == len(answers), f"{len(per_turn)} samples for {len(answers)} answers")
for sample, answer in zip(per_turn, answers):
    spans = [thinking_tokenizer.decode(span) for span in masked_spans(sample)]
    check(spans == [answer + "<|im_end|>"], f"--each-turn spans {spans}, expected {answer!r}")

# A target without config.json: the file is named.
os.remove(os.path.join(small, "config.json"))
result = prepare(os.path.join(work, "no-config-out"), openai, "--target", small)
check(result.returncode == 1 and os.path.join(small, "config.json") in result.stderr,
      f"missing config.json: {result.stderr}")

shutil.rmtree(work)
print("ok")
