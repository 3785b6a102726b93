"""Makes the embedded default's target: a byte-level BPE tokenizer with a
ChatML chat template, trained on the chat tasks of tasks.py, and a small
Qwen3 model (a few million parameters) trained on them, saved together as a
Hugging Face model directory that transformers and dflex load.

    make_target.py --out DIR [--steps N] [--seed S] [--device cpu|cuda]

(--steps 0: the tokenizer and an untrained model, for tests.)
Prints progress, the held-out exact-answer rate of greedy decoding at the
end, and writes DIR atomically (a temporary directory renamed into place)."""
import argparse
import math
import os
import random
import shutil
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tasks  # noqa: E402

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
END_OF_TEXT, TURN_START, TURN_END, MASK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"
VOCAB_SIZE = 1024
# Enough layers for the drafter to read several of them (target_layer_ids in train.yaml).
MODEL = dict(hidden_size=192, intermediate_size=512, num_hidden_layers=4, num_attention_heads=3,
             num_key_value_heads=1, head_dim=64, max_position_embeddings=512)


def render(conversation):
    return "".join(f"{TURN_START}{m['role']}\n{m['content']}{TURN_END}\n" for m in conversation["messages"])


def make_tokenizer(rng):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2, show_progress=False,
                                  special_tokens=[END_OF_TEXT, TURN_START, TURN_END, MASK],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator((render(tasks.conversation(rng)) for _ in range(20000)), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=TURN_END, pad_token=END_OF_TEXT,
                                   chat_template=CHAT_TEMPLATE)


def batches(tokenizer, rng, batch_size, device):
    """Endless padded batches of whole conversations (the loss on every real token)."""
    pad = tokenizer.pad_token_id
    while True:
        rows = [tokenizer(render(tasks.conversation(rng)))["input_ids"] for _ in range(batch_size)]
        length = max(len(r) for r in rows)
        ids = torch.full((batch_size, length), pad, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r)
        attention = (torch.arange(length)[None, :] < torch.tensor([len(r) for r in rows])[:, None]).long()
        labels = ids.masked_fill(attention == 0, -100)
        yield ids.to(device), attention.to(device), labels.to(device)


def exact_answers(model, tokenizer, rng, count, device):
    """Share of held-out requests the greedy target answers exactly as tasks.py would."""
    tokenizer.padding_side = "left"
    conversations = [tasks.conversation(rng) for _ in range(count)]
    prompts = [tokenizer.apply_chat_template(c["messages"][:1], tokenize=False, add_generation_prompt=True)
               for c in conversations]
    encoded = tokenizer(prompts, return_tensors="pt", padding=True).to(device)
    with torch.no_grad():
        out = model.generate(**encoded, max_new_tokens=160, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    answers = tokenizer.batch_decode(out[:, encoded["input_ids"].shape[1]:], skip_special_tokens=True)
    return sum(a.strip() == c["messages"][1]["content"] for a, c in zip(answers, conversations)) / count


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=700)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    started = time.monotonic()
    tokenizer = make_tokenizer(rng)
    config = Qwen3Config(vocab_size=VOCAB_SIZE, tie_word_embeddings=True,
                         bos_token_id=tokenizer.convert_tokens_to_ids(END_OF_TEXT),
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **MODEL)
    model = Qwen3ForCausalLM(config).to(args.device)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"make_target: tokenizer of {len(tokenizer)} tokens; Qwen3 target of {parameters / 1e6:.1f}M "
          f"parameters, training {args.steps} steps of {args.batch_size} conversations on {args.device}",
          flush=True)

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = max(1, args.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / max(args.steps, 1))))
    model.train()
    data = batches(tokenizer, rng, args.batch_size, args.device)
    average = None
    for step in range(1, args.steps + 1):
        ids, attention, labels = next(data)
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        average = loss.item() if average is None else 0.95 * average + 0.05 * loss.item()
        if step % 50 == 0 or step == args.steps:
            print(f"make_target: step {step}/{args.steps}  loss {average:.3f}  "
                  f"{time.monotonic() - started:.0f} s", flush=True)

    model.eval()
    if args.steps:
        rate = exact_answers(model, tokenizer, random.Random(args.seed + 1), 64, args.device)
        print(f"make_target: the target answers {rate:.0%} of 64 held-out requests exactly", flush=True)

    partial = args.out.rstrip("/") + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.to("cpu").save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    shutil.rmtree(args.out, ignore_errors=True)
    os.replace(partial, args.out)
    print(f"make_target: wrote {args.out} in {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
