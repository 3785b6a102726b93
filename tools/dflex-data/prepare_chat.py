#!/usr/bin/env python3
"""Tokenizes chat JSONL with a target model's own tokenizer and chat template
(transformers), printing one tokenized sample per record to stdout:

    {"input_ids": [...], "loss_mask": [...], "origin": "INPUT.jsonl:LINE"}

The loss mask is 1 on the tokens of assistant turns (the assistant's content
and the template's end-of-turn token(s) for it), 0 on the rest (system and
user turns, role headers, the generation prompt). `dflex-data prepare` runs
this and writes the samples as a binary dataset (docs/data.md); the output is
also valid tokenized JSONL for `dflex-data convert` ("origin" is ignored there).

Records: {"messages": [{"role": "system"|"user"|"assistant", "content": ...}]}
(OpenAI) or {"conversations": [{"from": "system"|"human"|"gpt", "value": ...}]}
(ShareGPT; "user" and "assistant" are accepted in "from" too).

Exit status: 0; 2 for a bad command line or a malformed record (named
FILE:LINE); 1 for anything else (a tokenizer that cannot be loaded, a chat
template that does not render turns as prefixes of the conversation)."""
import argparse
import json
import os
import sys

ROLES = {"system": "system", "user": "user", "assistant": "assistant"}
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user",
                  "gpt": "assistant", "assistant": "assistant"}


class RecordError(Exception):
    """A malformed record (exit 2)."""


class TemplateError(Exception):
    """The chat template cannot be used to find the assistant tokens (exit 1)."""


def fail(message, status):
    sys.stderr.write(f"prepare_chat: error: {message}\n")
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


def messages_of(record):
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
    if not any(m["role"] == "assistant" for m in messages):
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


def main():
    parser = argparse.ArgumentParser(
        prog="prepare_chat.py",
        description="Tokenize chat JSONL with a target's tokenizer and chat template.")
    parser.add_argument("--target", required=True,
                        help="the target model's directory (tokenizer files, chat template)")
    turns = parser.add_mutually_exclusive_group()
    turns.add_argument("--last-turn-only", action="store_true",
                       help="train only on the last assistant turn of each conversation")
    turns.add_argument("--each-turn", action="store_true",
                       help="one sample per assistant turn: the conversation up to it, trained on "
                            "it alone (for templates that render earlier turns differently once "
                            "more follow, as Qwen3's does with its thinking blocks)")
    parser.add_argument("--max-length", type=int, metavar="N",
                        help="cut samples to N tokens; samples left without assistant "
                             "tokens are skipped")
    parser.add_argument("inputs", nargs="+", metavar="INPUT.jsonl")
    args = parser.parse_args()
    if args.max_length is not None and args.max_length < 1:
        parser.error("--max-length needs a positive integer")

    # The samples go to the original stdout; whatever else prints there (a
    # library's notice) goes to stderr instead of into the samples.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    try:
        from transformers import AutoTokenizer
    except ImportError as error:
        fail(f"cannot import transformers ({error}); install it with pip install transformers", 1)
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.target)
    except Exception as error:  # transformers raises many kinds
        fail(f"cannot load the tokenizer of {args.target}: {error}", 1)
    if not getattr(tokenizer, "chat_template", None):
        fail(f"the tokenizer of {args.target} has no chat template", 1)
    special_ids = set(tokenizer.all_special_ids)
    for token in getattr(tokenizer, "added_tokens_decoder", {}).values():
        if getattr(token, "special", False):
            special_ids.add(tokenizer.convert_tokens_to_ids(str(token)))

    records = skipped = tokens = trained = 0
    for path in args.inputs:
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
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    fail(f"{origin}: not JSON: {error.msg} at column {error.colno}", 2)
                try:
                    messages = messages_of(record)
                    if args.each_turn:
                        samples = [(f"{origin} turn {i}",
                                    tokenize_record(tokenizer, messages[:i + 1], True, special_ids))
                                   for i, m in enumerate(messages) if m["role"] == "assistant"]
                    else:
                        samples = [(origin, tokenize_record(tokenizer, messages, args.last_turn_only,
                                                            special_ids))]
                except RecordError as error:
                    fail(f"{origin}: {error}", 2)
                except TemplateError as error:
                    fail(f"{origin}: {error}", 1)
                except Exception as error:  # the template raised (jinja2, ...)
                    fail(f"{origin}: the chat template failed: {type(error).__name__}: {error}", 1)
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
    sys.stderr.write(f"prepare_chat: {records} records, {skipped} samples skipped{reason}, "
                     f"{tokens} tokens, {trained} assistant tokens\n")


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:
        # The reader stopped (dflex-data failed and said why): exit quietly,
        # without flushing into the closed pipe again.
        os._exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
