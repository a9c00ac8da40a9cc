"""PEFT LoRA training throughput on a Qwen2.5-0.5B-shaped model: the peer of `octoflow train` in
docs/PERFORMANCE.md. Random weights of the real architecture (the speed does not depend on the
values; the device has no network for the real checkpoint), bf16, LoRA rank 16 / alpha 32 on
q, k, v, o, gate, up, down, AdamW with clipping at 1.0, batch BATCH x SEQ random token ids.
Prints tokens/s over the timed steps (after warm-up) and the peak CUDA memory."""
import argparse
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen2Config, Qwen2ForCausalLM


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    a = ap.parse_args()
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
        rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config).to(torch.bfloat16).cuda()
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                      "up_proj", "down_proj"])
    model = get_peft_model(model, lora)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=2e-4)
    ids = torch.randint(0, config.vocab_size, (a.batch, a.seq), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    tok = a.steps * a.batch * a.seq
    print(f"peft bf16 (torch {torch.__version__}, {torch.cuda.get_device_name()}): "
          f"{tok / dt:,.0f} tok/s over {a.steps} steps of {a.batch} x {a.seq}, "
          f"peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB, "
          f"{sum(p.numel() for p in params):,} trainable parameters")


if __name__ == "__main__":
    main()
