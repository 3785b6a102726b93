#!/usr/bin/env python3
"""The chat side of dflex's data tools, with a target model's own tokenizer
and chat template (transformers). dflex-data and dflex-eval run it; it prints
one JSON object per line to stdout and its errors and progress to stderr.

  chat_helper.py tokenize --target DIR [--last-turn-only | --each-turn] [--max-length N] INPUT.jsonl...
      One tokenized sample per record:
          {"input_ids": [...], "loss_mask": [...], "origin": "INPUT.jsonl:LINE"}
      The loss mask is 1 on the tokens of assistant turns (the assistant's
      content and the template's end-of-turn token(s) for it), 0 on the rest
      (system and user turns, role headers, the generation prompt). `dflex-data
      prepare` writes the samples as a binary dataset (docs/data.md); the output
      is also valid tokenized JSONL for `dflex-data convert`.

  chat_helper.py prompts --target DIR INPUT.jsonl
      One prompt per record, {"input_ids": [...], "origin": ...}: a chat record's
      turns up to its last non-assistant turn, rendered with the generation
      prompt (trailing assistant turns, the answers, are left out); a record of
      token ids ({"input_ids": [...]}) as it is. dflex-eval's prompts.

  chat_helper.py regenerate --target DIR --journal FILE [--max-new-tokens N] [--batch-size B]
                            [--temperature T] [--top-p P] [--seed S] [--device D] INPUT.jsonl...
      Answers each record's prompt (as for `prompts`) with the target
      (transformers' generate, batched, greedy at temperature 0) and appends the
      conversation with the target's answer in place of the record's to the
      journal (chat JSONL; its settings in FILE.settings.json), one batch at a
      time (flushed and synced). Run again with the same arguments, it resumes
      after the last whole batch: nothing is answered twice or lost, and the
      answers equal an uninterrupted run's (per-batch seeds).
      Prints nothing to stdout; `dflex-data regenerate` tokenizes the journal.

Records: {"messages": [{"role": "system"|"user"|"assistant", "content": ...}]}
(OpenAI) or {"conversations": [{"from": "system"|"human"|"gpt", "value": ...}]}
(ShareGPT; "user" and "assistant" are accepted in "from" too).

Exit status: 0; 2 for a bad command line, a malformed record (named
FILE:LINE) or a journal written with other arguments; 1 for anything else (a
tokenizer or model that cannot be loaded, a chat template that does not
render turns as prefixes of the conversation)."""
import argparse
import json
import os
import sys
import time

ROLES = {"system": "system", "user": "user", "assistant": "assistant"}
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user",
                  "gpt": "assistant", "assistant": "assistant"}


class RecordError(Exception):
    """A malformed record (exit 2)."""


class TemplateError(Exception):
    """The chat template cannot be used to find the assistant tokens (exit 1)."""


def fail(message, status):
    sys.stderr.write(f"chat_helper: error: {message}\n")
    sys.stderr.flush()
    sys.exit(status)


def content_text(content, what):
    """The text of a message's content: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        if not content:
            raise RecordError(f"{what} has an empty content list")
        texts = []
        for j, part in enumerate(content):
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type", "text") == "text" \
                    and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                raise RecordError(f"{what}: content part {j} is not a text part "
                                  '(a string or {"type": "text", "text": ...})')
        return "".join(texts)
    raise RecordError(f"{what}: content is neither a string nor a list of text parts")


def messages_of(record, needs_answer=True):
    """The record's turns as [{"role", "content"}] in the chat template's terms."""
    if not isinstance(record, dict):
        raise RecordError("expected a JSON object")
    if "messages" in record:
        turns, role_key, text_key, roles = record["messages"], "role", "content", ROLES
        kind = "messages"
    elif "conversations" in record:
        turns, role_key, text_key, roles = record["conversations"], "from", "value", SHAREGPT_ROLES
        kind = "conversations"
    else:
        raise RecordError('no "messages" or "conversations"')
    if not isinstance(turns, list):
        raise RecordError(f'"{kind}" is not a list')
    if not turns:
        raise RecordError(f'"{kind}" is empty')
    messages = []
    for i, turn in enumerate(turns):
        what = f"{kind}[{i}]"
        if not isinstance(turn, dict):
            raise RecordError(f"{what} is not an object")
        if role_key not in turn:
            raise RecordError(f'{what} has no "{role_key}"')
        role = turn[role_key]
        if not isinstance(role, str) or role not in roles:
            raise RecordError(f"{what} has unknown role {json.dumps(role)} "
                              f"(expected one of {', '.join(roles)})")
        if text_key not in turn:
            raise RecordError(f'{what} has no "{text_key}"')
        messages.append({"role": roles[role], "content": content_text(turn[text_key], what)})
    if needs_answer and not any(m["role"] == "assistant" for m in messages):
        raise RecordError("no assistant turn")
    return messages


def render(tokenizer, messages, add_generation_prompt):
    ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False,
                                        add_generation_prompt=add_generation_prompt)
    if hasattr(ids, "keys"):  # a BatchEncoding, whatever return_dict did
        ids = ids["input_ids"]
    return list(ids)


def tokenize_record(tokenizer, messages, last_turn_only, special_ids):
    """input_ids and loss_mask of a conversation."""
    ids = render(tokenizer, messages, False)
    mask = [0] * len(ids)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if last_turn_only:
        turns = turns[-1:]
    for i in turns:
        prompt = render(tokenizer, messages[:i], True)
        turn = render(tokenizer, messages[:i + 1], False)
        for prefix, what in ((prompt, f"turns [0, {i}) with the generation prompt"),
                             (turn, f"turns [0, {i + 1})")):
            if ids[:len(prefix)] != prefix:
                raise TemplateError(
                    f"the chat template does not render turns as prefixes: the tokens of {what} "
                    "rendered alone are not a prefix of the whole conversation's tokens "
                    "(--last-turn-only needs this for the last assistant turn only)")
        start, end = len(prompt), len(turn)
        # What the template writes after the turn's last special token (the
        # newline after ChatML's <|im_end|>) is glue before the next turn, not
        # something the model generates: it is left out of the mask.
        last_special = max((k for k in range(start, end) if ids[k] in special_ids), default=None)
        if last_special is not None and last_special + 1 < end and \
                not tokenizer.decode(ids[last_special + 1:end]).strip():
            end = last_special + 1
        for k in range(start, end):
            mask[k] = 1
    return ids, mask



def records_of(paths):
    """(origin, record) of every non-blank line of the inputs; a malformed line exits 2."""
    for path in paths:
        try:
            stream = open(path, encoding="utf-8")
        except OSError as error:
            fail(f"cannot open {path}: {error.strerror}", 1)
        with stream:
            line_number = 0
            while True:
                origin = f"{path}:{line_number + 1}"
                try:
                    line = stream.readline()
                except UnicodeDecodeError as error:
                    fail(f"{origin}: not UTF-8 ({error.reason})", 2)
                if not line:
                    break
                line_number += 1
                if not line.strip():
                    continue
                try:
                    yield origin, json.loads(line)
                except json.JSONDecodeError as error:
                    fail(f"{origin}: not JSON: {error.msg} at column {error.colno}", 2)


def prompt_messages(record):
    """The turns a chat record asks the model to answer: up to its last non-assistant turn."""
    messages = messages_of(record, needs_answer=False)
    while messages and messages[-1]["role"] == "assistant":
        messages.pop()
    if not messages or messages[-1]["role"] != "user":
        raise RecordError("no user turn to answer")
    return messages


def load_tokenizer(target):
    try:
        from transformers import AutoTokenizer
    except ImportError as error:
        fail(f"cannot import transformers ({error}); install it with pip install transformers", 1)
    try:
        tokenizer = AutoTokenizer.from_pretrained(target)
    except Exception as error:  # transformers raises many kinds
        fail(f"cannot load the tokenizer of {target}: {error}", 1)
    if not getattr(tokenizer, "chat_template", None):
        fail(f"the tokenizer of {target} has no chat template", 1)
    return tokenizer


def checked(origin, work):
    """work() with a record's errors named by its origin."""
    try:
        return work()
    except RecordError as error:
        fail(f"{origin}: {error}", 2)
    except TemplateError as error:
        fail(f"{origin}: {error}", 1)
    except Exception as error:  # the template raised (jinja2, ...)
        fail(f"{origin}: the chat template failed: {type(error).__name__}: {error}", 1)


def tokenize(args, out):
    if args.max_length is not None and args.max_length < 1:
        fail("--max-length needs a positive integer", 2)
    tokenizer = load_tokenizer(args.target)
    special_ids = set(tokenizer.all_special_ids)
    for token in getattr(tokenizer, "added_tokens_decoder", {}).values():
        if getattr(token, "special", False):
            special_ids.add(tokenizer.convert_tokens_to_ids(str(token)))

    records = skipped = tokens = trained = 0
    for origin, record in records_of(args.inputs):
        def samples_of():
            messages = messages_of(record)
            if args.each_turn:
                return [(f"{origin} turn {i}", tokenize_record(tokenizer, messages[:i + 1], True, special_ids))
                        for i, m in enumerate(messages) if m["role"] == "assistant"]
            return [(origin, tokenize_record(tokenizer, messages, args.last_turn_only, special_ids))]
        samples = checked(origin, samples_of)
        records += 1
        for sample_origin, (ids, mask) in samples:
            if args.max_length is not None:
                ids, mask = ids[:args.max_length], mask[:args.max_length]
            if not any(mask):
                skipped += 1
                continue
            tokens += len(ids)
            trained += sum(mask)
            out.write(json.dumps({"input_ids": ids, "loss_mask": mask, "origin": sample_origin},
                                 separators=(",", ":")) + "\n")
    out.flush()
    reason = " (no assistant token within --max-length)" if args.max_length else ""
    sys.stderr.write(f"chat_helper: {records} records, {skipped} samples skipped{reason}, "
                     f"{tokens} tokens, {trained} assistant tokens\n")


def prompts(args, out):
    tokenizer = None
    for origin, record in records_of([args.input]):
        if isinstance(record, dict) and "input_ids" in record:
            ids = record["input_ids"]  # dflex-eval checks them against the vocabulary
        else:
            messages = checked(origin, lambda: prompt_messages(record))
            tokenizer = tokenizer or load_tokenizer(args.target)
            ids = checked(origin, lambda: render(tokenizer, messages, True))
        out.write(json.dumps({"input_ids": ids, "origin": origin}, separators=(",", ":")) + "\n")
    out.flush()


class Journal:
    """The regenerated conversations so far, one line per answered record (chat JSONL that
    `tokenize` reads), and beside it FILE.settings.json, the settings they were made with."""

    def __init__(self, path, settings, records):
        self.path = path
        self.done = []
        settings_path = path + ".settings.json"
        if os.path.exists(settings_path):
            with open(settings_path, encoding="utf-8") as f:
                recorded = json.load(f)
            changed = sorted(k for k in set(settings) | set(recorded) if settings.get(k) != recorded.get(k))
            if changed:
                fail(f"{path}: the journal was written with other settings "
                     f"({', '.join(f'{k}: {recorded.get(k)!r}' for k in changed)}); "
                     "run with those, or remove it (and its .settings.json) to start again", 2)
            if os.path.exists(path):
                self._resume(settings["batch_size"], records)
        elif os.path.exists(path):
            fail(f"{path}: a journal without its {os.path.basename(settings_path)}; "
                 "remove it or name another --journal", 2)
        else:
            partial = settings_path + ".partial"
            with open(partial, "w", encoding="utf-8") as f:
                json.dump(settings, f, indent=2)
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, settings_path)

    def _resume(self, batch_size, records):
        with open(self.path, "rb") as f:
            data = f.read()
        # Only whole lines count: a write cut short leaves a last line without its newline.
        lines = data.split(b"\n")[:-1]
        for line in lines:
            try:
                self.done.append(json.loads(line)["origin"])
            except (ValueError, KeyError, TypeError):
                break
        # Resume at a batch boundary, so every batch is generated whole (and seeded) as before;
        # only the last batch may be short.
        if len(self.done) < records:
            del self.done[len(self.done) - len(self.done) % batch_size:]
        kept = sum(len(line) + 1 for line in lines[:len(self.done)])
        if kept != len(data):
            with open(self.path, "r+b") as f:
                f.truncate(kept)
                f.flush()
                os.fsync(f.fileno())

    def append(self, records):
        with open(self.path, "a", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.done.extend(r["origin"] for r in records)


def regenerate(args, out):
    del out  # the answers go to the journal
    for name in ("max_new_tokens", "batch_size"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} needs a positive integer", 2)
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        fail("--temperature needs a value >= 0 and --top-p one in (0, 1]", 2)
    todo = [(origin, checked(origin, lambda: prompt_messages(record)))
            for origin, record in records_of(args.inputs)]
    if not todo:
        fail("no records to answer", 2)
    settings = {"target": os.path.abspath(args.target), "inputs": [os.path.abspath(p) for p in args.inputs],
                "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
                "temperature": args.temperature, "top_p": args.top_p, "seed": args.seed}
    journal = Journal(args.journal, settings, len(todo))
    expected = [origin for origin, _ in todo[:len(journal.done)]]
    if journal.done != expected:
        fail(f"{args.journal}: its records are not the first ones of the inputs; "
             "remove it or name another --journal", 2)
    if len(journal.done) == len(todo):
        sys.stderr.write(f"chat_helper: all {len(todo)} records were answered already\n")
        return
    if journal.done:
        sys.stderr.write(f"chat_helper: resuming after {len(journal.done)} of {len(todo)} answered records\n")

    import torch
    from transformers import AutoModelForCausalLM
    tokenizer = load_tokenizer(args.target)
    tokenizer.padding_side = "left"  # generation continues every row from its last token
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    try:
        model = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).to(device).eval()
    except Exception as error:
        fail(f"cannot load the model of {args.target}: {error}", 1)
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])

    started, answered, unfinished = time.monotonic(), 0, 0
    for first in range(len(journal.done), len(todo), args.batch_size):
        batch = todo[first:first + args.batch_size]
        texts = [checked(origin, lambda: tokenizer.apply_chat_template(messages, tokenize=False,
                                                                       add_generation_prompt=True))
                 for origin, messages in batch]
        encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
        torch.manual_seed(args.seed * 1_000_003 + first // args.batch_size)
        with torch.no_grad():
            generated = model.generate(
                **encoded, max_new_tokens=args.max_new_tokens, do_sample=args.temperature > 0,
                temperature=args.temperature if args.temperature > 0 else None,
                top_p=args.top_p if args.temperature > 0 else None, top_k=None,
                eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
        new_tokens = generated[:, encoded["input_ids"].shape[1]:].tolist()
        records = []
        for (origin, messages), tokens in zip(batch, new_tokens):
            finished = any(t in eos_ids for t in tokens)
            unfinished += not finished
            answer = tokenizer.decode(tokens, skip_special_tokens=True)
            records.append({"messages": messages + [{"role": "assistant", "content": answer}],
                            "origin": origin, "finished": finished})
        journal.append(records)
        answered += len(batch)
        rate = answered / max(time.monotonic() - started, 1e-9)
        sys.stderr.write(f"chat_helper: answered {len(journal.done)}/{len(todo)} records "
                         f"({rate:.1f} per second)\n")
        sys.stderr.flush()
    if unfinished:
        sys.stderr.write(f"chat_helper: {unfinished} answers reached --max-new-tokens before the end of "
                         "their turn (kept, cut there)\n")


def main():
    parser = argparse.ArgumentParser(prog="chat_helper.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    tokenizing = commands.add_parser("tokenize", help="chat records to tokenized samples")
    tokenizing.add_argument("--target", required=True,
                            help="the target model's directory (tokenizer files, chat template)")
    turns = tokenizing.add_mutually_exclusive_group()
    turns.add_argument("--last-turn-only", action="store_true",
                       help="train only on the last assistant turn of each conversation")
    turns.add_argument("--each-turn", action="store_true",
                       help="one sample per assistant turn: the conversation up to it, trained on "
                            "it alone (for templates that render earlier turns differently once "
                            "more follow, as Qwen3's does with its thinking blocks)")
    tokenizing.add_argument("--max-length", type=int, metavar="N",
                            help="cut samples to N tokens; samples left without assistant "
                                 "tokens are skipped")
    tokenizing.add_argument("inputs", nargs="+", metavar="INPUT.jsonl")
    prompting = commands.add_parser("prompts", help="records to prompt token ids")
    prompting.add_argument("--target", required=True)
    prompting.add_argument("input", metavar="INPUT.jsonl")
    answering = commands.add_parser("regenerate", help="answer the records' prompts with the target")
    answering.add_argument("--target", required=True)
    answering.add_argument("--journal", required=True, help="the regenerated conversations (JSONL)")
    answering.add_argument("--max-new-tokens", type=int, default=512)
    answering.add_argument("--batch-size", type=int, default=64)
    answering.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    answering.add_argument("--top-p", type=float, default=1.0)
    answering.add_argument("--seed", type=int, default=0)
    answering.add_argument("--device", help="default: cuda when there is a GPU, else cpu")
    answering.add_argument("inputs", nargs="+", metavar="INPUT.jsonl")
    args = parser.parse_args()

    # The samples go to the original stdout; whatever else prints there (a
    # library's notice) goes to stderr instead of into the samples.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    {"tokenize": tokenize, "prompts": prompts, "regenerate": regenerate}[args.command](args, out)


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:
        # The reader stopped (dflex-data failed and said why): exit quietly,
        # without flushing into the closed pipe again.
        os._exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
