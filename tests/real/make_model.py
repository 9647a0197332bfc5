"""Make a tiny local Qwen2 model directory for the real-SGLang test tier.

Run with the real venv's python (it needs torch, transformers, tokenizers):

    <venv python> tests/real/make_model.py OUTDIR

No hub access: HF_HUB_OFFLINE=1 is set before transformers is imported.
Deterministic: seeded weights, a tokenizer trained on fixed text.  The
directory is built beside OUTDIR and renamed into place once complete, so a
half-made model is never picked up; an existing complete OUTDIR is reused.
The last stdout line is OUTDIR.
"""

import json
import os
import shutil
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# The torchvision schema hook (see standins/sitecustomize.py): transformers
# imports torchvision, whose CUDA-linked _C does not load with CPU torch.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "standins"))
import sitecustomize  # noqa: F401  (ours, or already run at startup)

MARKER = ".ktd-tiny-model-complete"
SEED = 1234

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, how are you today? I am fine, thank you.",
    "ktd launches SGLang servers with the ktransformers backend.",
    "A tiny model answers with random words, and that is fine for tests.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000.",
    "user assistant system: say hello, say goodbye.",
    "Streaming responses end with a usage chunk and [DONE].",
    "The server is fired up and ready to roll!",
]


def build(out):
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(SEED)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(SENTENCES * 4, trainer=trainer)

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=256,
    )
    hf_tok.chat_template = CHATML
    hf_tok.save_pretrained(out)

    eos = hf_tok.convert_tokens_to_ids("<|im_end|>")
    pad = hf_tok.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=pad,
        eos_token_id=eos,
        pad_token_id=pad,
        dtype="bfloat16",
    )
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.save_pretrained(out)
    with open(os.path.join(out, MARKER), "w") as f:
        json.dump({"seed": SEED, "vocab": len(hf_tok), "eos_token_id": eos}, f)


def main(argv):
    if len(argv) != 2:
        sys.exit(f"usage: {argv[0]} OUTDIR")
    out = os.path.abspath(argv[1])
    if not os.path.exists(os.path.join(out, MARKER)):
        tmp = f"{out}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        try:
            build(tmp)
            shutil.rmtree(out, ignore_errors=True)
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print(out)


if __name__ == "__main__":
    main(sys.argv)
