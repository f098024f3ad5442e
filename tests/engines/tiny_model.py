"""A tiny Llama-architecture model made on the spot, for the engine tests.

Nothing comes from a model hub: the weights are random (a fixed seed), the
tokenizer is a word-level vocabulary built here with the `tokenizers`
library, saved as a PreTrainedTokenizerFast without a chat template. The
model is small enough that vLLM's CPU build loads and serves it in seconds.

    python tests/engines/tiny_model.py DIR     # writes the model into DIR
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

# Words of the vocabulary: syllable pairs, deterministic.
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pu",
              "do", "fe", "gi", "ho", "ju", "be", "ce", "wa")
SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")

LAYERS = 2
HIDDEN = 128
HEADS = 2
INTERMEDIATE = 256
SEED = 1234


def vocabulary() -> list[str]:
    words = [a + b for a in _SYLLABLES for b in _SYLLABLES]
    return list(SPECIALS) + words  # 4 + 324 = 328 tokens


def sentence(rng: random.Random, n_words: int) -> str:
    words = vocabulary()[len(SPECIALS):]
    return " ".join(rng.choice(words) for _ in range(n_words))


def _tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(vocabulary())}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        model_max_length=4096,
    )
    fast.save_pretrained(str(out))
    # No chat template, no BOS added by the post-processor: a prompt's token
    # ids are exactly its words', so prefix blocks line up across prompts.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("chat_template", None)
    cfg["add_bos_token"] = False
    cfg["add_eos_token"] = False
    cfg_path.write_text(json.dumps(cfg, indent=2))


def _config(layers: int, hidden: int, heads: int, intermediate: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": len(vocabulary()),
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": hidden // heads,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 3,
        "attention_bias": False,
        "mlp_bias": False,
    }


def _weights(out: Path, layers: int, hidden: int, heads: int, intermediate: int) -> None:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(SEED)
    V, H, I = len(vocabulary()), hidden, intermediate
    hd = hidden // heads

    def rnd(*shape: int, std: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * std).contiguous()

    t: dict[str, torch.Tensor] = {}
    # Large enough a spread that the next token depends on the whole context
    # (attention not flat): KV bytes that came back wrong change the output.
    t["model.embed_tokens.weight"] = rnd(V, H, std=1.0)
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = torch.ones(H)
        t[p + "post_attention_layernorm.weight"] = torch.ones(H)
        t[p + "self_attn.q_proj.weight"] = rnd(heads * hd, H, std=0.3)
        t[p + "self_attn.k_proj.weight"] = rnd(heads * hd, H, std=0.3)
        t[p + "self_attn.v_proj.weight"] = rnd(heads * hd, H, std=0.3)
        t[p + "self_attn.o_proj.weight"] = rnd(H, heads * hd, std=0.1)
        t[p + "mlp.gate_proj.weight"] = rnd(I, H, std=0.1)
        t[p + "mlp.up_proj.weight"] = rnd(I, H, std=0.1)
        t[p + "mlp.down_proj.weight"] = rnd(H, I, std=0.1)
    t["model.norm.weight"] = torch.ones(H)
    t["lm_head.weight"] = rnd(V, H, std=0.5)
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})


def kv_bytes_per_block(block_tokens: int, layers: int = LAYERS, hidden: int = HIDDEN,
                       heads: int = HEADS, **_) -> int:
    """Bytes of one KV block of the model (float32 K and V of every layer)."""
    return layers * 2 * heads * (hidden // heads) * block_tokens * 4


def make_tiny_model(out: str | os.PathLike, layers: int = LAYERS, hidden: int = HIDDEN,
                    heads: int = HEADS, intermediate: int = INTERMEDIATE) -> Path:
    """Writes config, weights and tokenizer into `out` (created); returns it.
    The defaults make the 2-layer model of the tests; the TTFT bench asks for
    a larger one, whose prefill costs enough to measure."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    dims = (layers, hidden, heads, intermediate)
    (out / "config.json").write_text(json.dumps(_config(*dims), indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}))
    _weights(out, *dims)
    _tokenizer(out)
    return out


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    print(make_tiny_model(sys.argv[1]))
