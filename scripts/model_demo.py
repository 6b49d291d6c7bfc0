#!/usr/bin/python3
"""A DeepSeek-V3-architecture model generating through mlaserve (docs/model.md): seeded
weights written as a server's --weights, the server started on them, then batched greedy
decoding of several sequences with local attention and with mlaserve's, the generated token
ids side by side, where they first differ and whether that step was a near-tie, tokens/s and
time per output token of each. Everything it starts is stopped and removed at the end.

    PYTHONPATH=build/python /usr/bin/python3 scripts/model_demo.py \\
        [--server build/bin/mlaserve-server] [--layers 2] [--sequences 8] [--steps 128]
        [--server-flag=--devices=cuda:0 ...]
"""

import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
import mlaserve  # noqa: E402
import mlaserve.model as m  # noqa: E402
from harness import Server, free_port  # noqa: E402

TOLERANCE = 0.05


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--server", default="build/bin/mlaserve-server",
                        help="the mlaserve-server binary to start")
    parser.add_argument("--layers", type=int, default=2,
                        help="decoder layers of the model (the server serves as many)")
    parser.add_argument("--sequences", type=int, default=8, help="sequences decoded as a batch")
    parser.add_argument("--steps", type=int, default=128,
                        help="tokens generated per sequence after its prompt")
    parser.add_argument("--prompt-tokens", type=int, default=4,
                        help="prompt length: all but the last are decoded as steps before "
                             "generation starts (and counted in the steps timed)")
    parser.add_argument("--shared-prompt", action="store_true",
                        help="prompts that agree but for their last token, the shared part "
                             "prefilled once and registered as a prefix on the server")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model's weights")
    parser.add_argument("--device", default="cpu", help="where the model runs (cuda:0)")
    parser.add_argument("--hidden-size", type=int, default=256,
                        help="7168 with --intermediate-size 18432 and --q-lora-rank 1536: "
                             "DeepSeek-V3's dense layer")
    parser.add_argument("--intermediate-size", type=int, default=512, help="the FFN's width")
    parser.add_argument("--q-lora-rank", type=int, default=192,
                        help="the query's low-rank width (q_a_proj)")
    parser.add_argument("--experts", type=int, default=0,
                        help="routed experts (a multiple of 8): MoE layers after the first")
    parser.add_argument("--micro-batches", default="1,2,3",
                        help="micro-batch counts to time through mlaserve, comma-separated")
    parser.add_argument("--data-plane", default="auto", choices=("auto", "shm", "grpc"),
                        help="how the model's calls travel: the C++ client and the server's "
                             "same-host data plane where the package has it, or grpcio")
    parser.add_argument("--server-flag", action="append", default=[],
                        help="passed to the server (e.g. --server-flag=--devices=cuda:0)")
    args = parser.parse_args()
    config = m.ModelConfig.tiny(layers=args.layers, hidden_size=args.hidden_size,
                                intermediate_size=args.intermediate_size,
                                q_lora_rank=args.q_lora_rank, experts=args.experts)
    model = m.DeepSeekModel(config, seed=args.seed, device=args.device)
    scratch = tempfile.mkdtemp(prefix="mlaserve-model-demo-")
    server = None
    try:
        weights = os.path.join(scratch, "weights.safetensors")
        model.save_weights(weights, server_only=True)
        target = f"127.0.0.1:{free_port()}"
        server = Server(args.server, [f"--listen={target}", "--metrics_listen=",
                                      f"--layers={args.layers}", f"--weights={weights}",
                                      *args.server_flag])
        if not server.ready(120):
            raise SystemExit("the server did not start:\n" + "".join(server.log[-20:]))
        client = mlaserve.Client(target, data_plane=args.data_plane)
        prompts = [[(7 * (0 if args.shared_prompt and i + 1 < args.prompt_tokens else b) +
                     3 * i + 1) % config.vocab_size for i in range(args.prompt_tokens)]
                   for b in range(args.sequences)]
        shared = args.shared_prompt

        def run(backend, forced=None):
            return m.generate(model, backend, prompts, args.steps, forced, shared)
        local = run(m.LocalAttention(model))
        served = run(m.MlaServeAttention(model, client))
        forced = [seq[args.prompt_tokens:] for seq in local.tokens]
        ref = run(m.LocalAttention(model), forced)
        print(f"model: DeepSeek-V3 architecture on {args.device}, {args.layers} layers, hidden "
              f"{config.hidden_size}, FFN {config.intermediate_size}, "
              f"{config.num_attention_heads} heads, latent "
              f"{config.kv_lora_rank} + RoPE {config.qk_rope_head_dim}, "
              + (f"MoE after layer 0 ({config.n_routed_experts} experts, "
                 f"{config.num_experts_per_tok} a token, 1 shared), " if args.experts else "")
              + f"seed {args.seed}; "
              f"{args.sequences} sequences x {args.steps} tokens, greedy"
              + (f"; a shared prompt of {args.prompt_tokens - 1} tokens registered as a prefix"
                 if shared else ""))
        for b in range(args.sequences):
            mine = local.tokens[b][args.prompt_tokens:]
            theirs = served.tokens[b][args.prompt_tokens:]
            differ = next((t for t in range(args.steps) if mine[t] != theirs[t]), None)
            note = "identical"
            if differ is not None:
                top2 = ref.logits[differ][b].topk(2).values
                margin = float(top2[0] - top2[1])
                note = (f"first differs at step {differ} (top-2 margin {margin:.3f}: "
                        f"{'a near-tie' if margin <= TOLERANCE else 'NOT a near-tie'})")
            print(f"  seq {b}  local   {' '.join(map(str, mine[:16]))} ...")
            print(f"         mlaserve {' '.join(map(str, theirs[:16]))} ...  {note}; "
                  f"{len(set(mine))} distinct")
        rest = run(m.NoAttention(model))
        local = run(m.LocalAttention(model))  # again, warm
        # A step is one token through the model, prompt or generated: with shared prompts the
        # prompt's all-but-last tokens are prefilled instead and only its last is a step.
        prompt_steps = local.steps - args.steps
        print(f"time per output token ({args.sequences} sequences, {local.steps} steps: "
              f"{prompt_steps} prompt token{'s' if prompt_steps != 1 else ''} decoded before "
              f"the {args.steps} generated, each timed as a step):")
        rest_ms = 1000 * rest.seconds / rest.steps
        local_ms = 1000 * local.seconds / local.steps
        attention_ms = max(0.0, local_ms - rest_ms)
        print(f"  the model without attention   {rest_ms:8.2f} ms")
        print(f"  with local attention          {local_ms:8.2f} ms  (attention "
              f"{attention_ms:.2f} ms; batched PyTorch)")
        for k in (int(x) for x in args.micro_batches.split(",")):
            backends = []

            def make(i, backends=backends):
                backends.append(m.MlaServeAttention(model, client, run_id=f"demo/mb{i}"))
                return backends[-1]
            run_k = m.generate_micro_batched(model, make, prompts, args.steps, k,
                                             shared_prefix=shared)
            ms = 1000 * run_k.seconds / run_k.steps
            calls = sum(b.calls for b in backends)
            exposed = sum(b.wait_seconds for b in backends) / run_k.seconds
            call_ms = 1000 * sum(b.call_seconds for b in backends) / calls
            server_ms = 1000 * sum(b.server_seconds for b in backends) / calls
            client_ms = 1000 * sum(b.client_seconds for b in backends) / calls
            alone = m.generate_micro_batched(model, lambda i: m.NoAttention(model), prompts,
                                             args.steps, k, shared_prefix=shared)
            alone_ms = 1000 * alone.seconds / alone.steps
            same = sum(run_k.tokens[b] == served.tokens[b] for b in range(args.sequences))
            print(f"  through mlaserve, {k} micro-batch{'es' if k > 1 else '  '} {ms:8.2f} ms  "
                  f"({args.sequences * run_k.steps / run_k.seconds:.1f} tokens/s; "
                  f"{ms / max(rest_ms, attention_ms):.2f}x the larger of attention and the "
                  f"rest; the model without attention in {k}: {alone_ms:.2f} ms; a call "
                  f"{call_ms:.2f} ms from sending to its answer's use, the server's part "
                  f"{server_ms:.2f} ms, this thread's encoding and conversion {client_ms:.2f} ms; "
                  f"waits on answers {100 * exposed:.0f} % of the wall; "
                  f"{same}/{args.sequences} sequences as with one)")
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
