"""What transformers makes of a config.json, for the runtime's config tests.

  describe PATH          print, as JSON, the fields of the text model config
                         that transformers builds from PATH (a config.json or a
                         directory holding one), after its own defaults
  make-qwen3 DIR         save a small Qwen3 config with transformers
  make-qwen3_5 DIR       save a small Qwen3.5 config (nested text_config)
"""
import json
import os
import shutil
import sys
import tempfile

import transformers


def load(path):
    if os.path.isdir(path):
        return transformers.AutoConfig.from_pretrained(path)
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(path, os.path.join(tmp, "config.json"))
        return transformers.AutoConfig.from_pretrained(tmp)


def describe(path):
    config = load(path)
    text = config.get_text_config()
    rope = text.rope_parameters or {}
    eos = text.eos_token_id
    out = {
        "model_type": text.model_type,
        "vocab_size": text.vocab_size,
        "hidden_size": text.hidden_size,
        "intermediate_size": text.intermediate_size,
        "num_hidden_layers": text.num_hidden_layers,
        "num_attention_heads": text.num_attention_heads,
        "num_key_value_heads": text.num_key_value_heads,
        "head_dim": text.head_dim,
        "max_position_embeddings": text.max_position_embeddings,
        "rms_norm_eps": text.rms_norm_eps,
        "hidden_act": text.hidden_act,
        "attention_bias": text.attention_bias,
        "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
        "rope_type": rope.get("rope_type", "default"),
        "rope_theta": rope.get("rope_theta"),
        "partial_rotary_factor": rope.get("partial_rotary_factor",
                                          getattr(text, "partial_rotary_factor", 1.0)),
        "layer_types": list(text.layer_types),
        "sliding_window": getattr(text, "sliding_window", None),
        "eos_token_ids": [] if eos is None else (list(eos) if isinstance(eos, (list, tuple)) else [eos]),
        "bos_token_id": text.bos_token_id,
    }
    if any(t == "linear_attention" for t in text.layer_types):
        out["linear"] = [text.linear_num_key_heads, text.linear_num_value_heads,
                         text.linear_key_head_dim, text.linear_value_head_dim,
                         text.linear_conv_kernel_dim]
    if hasattr(config, "dflash_config"):
        out["dflash_config"] = config.dflash_config
        out["block_size"] = getattr(config, "block_size", None)
        out["num_target_layers"] = getattr(config, "num_target_layers", None)
    print(json.dumps(out))


def main():
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "describe":
        describe(path)
    elif mode == "make-qwen3":
        transformers.Qwen3Config(
            vocab_size=1000, hidden_size=64, intermediate_size=160, num_hidden_layers=6,
            num_attention_heads=8, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
            rms_norm_eps=1e-5, use_sliding_window=True, sliding_window=256, max_window_layers=4,
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
            eos_token_id=[7, 9], bos_token_id=1, tie_word_embeddings=True,
        ).save_pretrained(path)
    elif mode == "make-qwen3_5":
        transformers.Qwen3_5Config(text_config=dict(
            vocab_size=2000, hidden_size=96, intermediate_size=192, num_hidden_layers=8,
            num_attention_heads=6, num_key_value_heads=2, head_dim=32,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=24, linear_conv_kernel_dim=4, eos_token_id=5,
        )).save_pretrained(path)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
