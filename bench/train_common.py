"""What the training benchmarks share: a random Qwen3 target saved as a Hugging Face directory, and
chat-length samples with a learnable structure."""
import json
import random


def make_qwen3_target(directory, layers, hidden, intermediate, heads=32, kv_heads=8, head_dim=128,
                      vocab=151936, device="cuda"):
    """A random bfloat16 Qwen3 (Qwen3-8B's attention and vocabulary by default), made on the GPU."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    config = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, head_dim=head_dim,
                         max_position_embeddings=40960, tie_word_embeddings=False,
                         rope_theta=1000000.0, torch_dtype="bfloat16")
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory, safe_serialization=True)


def make_qwen35_target(directory, layers, hidden, intermediate, heads, kv_heads, head_dim, linear_key_heads,
                       linear_value_heads, linear_dim, vocab=151936, device="cuda"):
    """A random bfloat16 Qwen3.5 hybrid text model: three gated-delta layers per gated
    full-attention layer."""
    import torch
    from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    config = Qwen3_5TextConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        linear_num_key_heads=linear_key_heads, linear_num_value_heads=linear_value_heads,
        linear_key_head_dim=linear_dim, linear_value_head_dim=linear_dim, linear_conv_kernel_dim=4,
        layer_types=["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)],
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3_5ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory, safe_serialization=True)


def make_data(path, samples=2000, lengths=(200, 2000), top=151000):
    """Chat-length samples (200 to 2000 tokens by default) with a learnable structure: runs of
    arithmetic progressions over ids below `top`; the first quarter of each is the prompt, outside
    the loss."""
    rng = random.Random(0)
    starts = top * 150 // 151
    with open(path, "w") as f:
        for _ in range(samples):
            length = rng.randrange(*lengths)
            ids, start = [], rng.randrange(starts)
            while len(ids) < length:
                stride = rng.randrange(1, 7)
                ids += [(start + stride * i) % top for i in range(rng.randrange(8, 64))]
                start = rng.randrange(starts)
            ids = ids[:length]
            mask = [int(i >= length // 4) for i in range(length)]
            f.write(json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n")
