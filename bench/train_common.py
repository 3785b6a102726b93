"""What the training benchmarks share: a random Qwen3 target saved as a Hugging Face directory, and
chat-length samples with a learnable structure."""
import json
import random


def make_qwen3_target(directory, layers, hidden, intermediate, heads=32, kv_heads=8, head_dim=128,
                      vocab=151936):
    """A random bfloat16 Qwen3 (Qwen3-8B's attention and vocabulary by default), made on the GPU."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    config = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, head_dim=head_dim,
                         max_position_embeddings=40960, tie_word_embeddings=False,
                         rope_theta=1000000.0, torch_dtype="bfloat16")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory, safe_serialization=True)


def make_data(path, samples=2000):
    """Chat-length samples (200 to 2000 tokens) with a learnable structure: runs of arithmetic
    progressions; the first quarter of each is the prompt, outside the loss."""
    rng = random.Random(0)
    with open(path, "w") as f:
        for _ in range(samples):
            length = rng.randrange(200, 2000)
            ids, start = [], rng.randrange(150000)
            while len(ids) < length:
                stride = rng.randrange(1, 7)
                ids += [(start + stride * i) % 151000 for i in range(rng.randrange(8, 64))]
                start = rng.randrange(150000)
            ids = ids[:length]
            mask = [int(i >= length // 4) for i in range(length)]
            f.write(json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n")
