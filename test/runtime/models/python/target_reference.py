"""Builds a tiny random target model with transformers and writes what it
computes, for the C++ target models to match:

  target_reference.py --model NAME --out DIR [--device cuda]

NAME is qwen3 (dense, untied head), qwen3_variant (tied embeddings, q/k/v/o
biases, sliding-window layers, YaRN RoPE) or qwen3_5 (hybrid: gated-delta and
gated full-attention layers, grouped value heads, sharded checkpoint); or
qwen3_gpu and qwen3_5_gpu, with the head dims the dflex kernels take (the
specs of ../model_specs.mlir): Qwen3 with heads of 128 and
sliding-window layers, Qwen3.5 with attention heads of 64 and gated-delta
key and value heads of 128.

The model is built and randomised on the CPU (the same weights everywhere)
and run by transformers on --device (default cpu). Writes DIR/model
(save_pretrained, float32) and, per dtype (float32, bfloat16),
DIR/reference_<dtype>.safetensors (CPU tensors) with
  input_ids [B, T], layer_<l> [B, T, H] (the output of decoder layer l, taken
  by a hook), final [B, T, H] (after the final norm), logits [B, T, V];
  packed_input_ids, packed_position_ids, cu_seqlens, packed_layer_<l>: rows
  packed from several documents, each document run on its own.
"""
import argparse
import pathlib

import torch
from safetensors.torch import save_file

BATCH, LENGTH = 2, 150  # several 64-token chunks of the gated delta rule plus a remainder
PACKED_DOCUMENTS = [[40, 70, 40], [1, 96, 53]]  # lengths per row, summing to LENGTH


def build(name):
    if name.startswith("qwen3_5"):
        from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig
        gpu = name == "qwen3_5_gpu"
        config = Qwen3_5TextConfig(
            vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64 if gpu else 32,
            linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=128 if gpu else 16, linear_value_head_dim=128 if gpu else 24,
            linear_conv_kernel_dim=4,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "partial_rotary_factor": 0.25},
            tie_word_embeddings=False)
        return Qwen3_5ForCausalLM(config)
    from transformers import Qwen3Config, Qwen3ForCausalLM
    if name == "qwen3":
        config = Qwen3Config(
            vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=False)
    elif name == "qwen3_gpu":
        config = Qwen3Config(
            vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=128,
            use_sliding_window=True, sliding_window=48, max_window_layers=2,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=False)
    elif name == "qwen3_variant":
        config = Qwen3Config(
            vocab_size=512, hidden_size=96, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=6, num_key_value_heads=2, head_dim=16, attention_bias=True,
            use_sliding_window=True, sliding_window=24, max_window_layers=2,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                             "original_max_position_embeddings": 64},
            max_position_embeddings=256, tie_word_embeddings=True)
    else:
        raise SystemExit(f"target_reference: unknown model {name}")
    return Qwen3ForCausalLM(config)


def randomize(model):
    """Random values where the initialisation is special (norms at 1 or 0,
    zero biases), so that every weight matters; embeddings at the scale of a
    trained model's, whose logits can be confident."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "embed_tokens" in name or "lm_head" in name:
                parameter.normal_(0.0, 0.5)
            elif "norm" in name:
                parameter.copy_(1.0 + 0.3 * torch.randn_like(parameter)
                                if parameter.mean().abs() > 0.5 else 0.3 * torch.randn_like(parameter))
            elif name.endswith("bias") and "dt_bias" not in name:
                parameter.normal_(0.0, 0.1)
            elif name.endswith("dt_bias"):
                parameter.normal_(0.0, 1.0)
            elif name.endswith("A_log"):
                parameter.uniform_(-2.0, 1.0)


def layer_outputs(model, input_ids, position_ids=None):
    """Every decoder layer's output, the final-normed hidden state, logits."""
    captured = []
    hooks = [layer.register_forward_hook(
        lambda _module, _inputs, output: captured.append(output[0] if isinstance(output, tuple) else output))
        for layer in model.model.layers]
    try:
        with torch.no_grad():
            out = model(input_ids=input_ids, position_ids=position_ids, output_hidden_states=True)
    finally:
        for hook in hooks:
            hook.remove()
    return captured, out.hidden_states[-1], out.logits


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    # float32 means float32 on a GPU too (cuDNN convolutions default to TF32).
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    torch.backends.cudnn.conv.fp32_precision = "ieee"

    torch.manual_seed(1234)
    model = build(args.model).eval()
    randomize(model)
    model_dir = args.out / "model"
    # The hybrid model is written in shards, to read an index.
    model.save_pretrained(model_dir, max_shard_size="200KB" if args.model == "qwen3_5" else "1GB")

    input_ids = torch.randint(0, model.config.vocab_size, (BATCH, LENGTH))
    packed_ids = torch.randint(0, model.config.vocab_size, (BATCH, LENGTH))
    bounds, positions = [0], torch.zeros(BATCH, LENGTH, dtype=torch.long)
    for row, lengths in enumerate(PACKED_DOCUMENTS):
        start = 0
        for length in lengths:
            positions[row, start:start + length] = torch.arange(length)
            start += length
            bounds.append(row * LENGTH + start)
        assert start == LENGTH

    from transformers import AutoModelForCausalLM
    for dtype in (torch.float32, torch.bfloat16):
        loaded = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        layers, final, logits = layer_outputs(loaded, input_ids.to(device))
        tensors = {"input_ids": input_ids, "final": final, "logits": logits}
        tensors.update({f"layer_{i}": h for i, h in enumerate(layers)})
        packed = [torch.zeros(BATCH, LENGTH, model.config.hidden_size, dtype=dtype)
                  for _ in layers]
        for row, lengths in enumerate(PACKED_DOCUMENTS):
            start = 0
            for length in lengths:
                document = packed_ids[row:row + 1, start:start + length].to(device)
                for i, h in enumerate(layer_outputs(loaded, document)[0]):
                    packed[i][row, start:start + length] = h[0]
                start += length
        tensors.update({"packed_input_ids": packed_ids, "packed_position_ids": positions,
                        "cu_seqlens": torch.tensor(bounds, dtype=torch.int32)})
        tensors.update({f"packed_layer_{i}": h for i, h in enumerate(packed)})
        name = "float32" if dtype == torch.float32 else "bfloat16"
        save_file({k: v.cpu().contiguous() for k, v in tensors.items()},
                  str(args.out / f"reference_{name}.safetensors"))
    print(f"target_reference: {args.model} written to {args.out}")


if __name__ == "__main__":
    main()
