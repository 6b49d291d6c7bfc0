"""Batched greedy decoding with either attention back end, and the comparison of two back
ends: teacher-forced logits step by step, and free-running output up to the first near-tie."""

import dataclasses
import threading
import time

import torch


@dataclasses.dataclass
class Generation:
    tokens: list          # per sequence: prompt + generated token ids
    logits: list          # per step after the prompt: [batch, vocab] float32
    seconds: float        # wall time of the decode steps (prompt included)
    steps: int            # model steps run (prompt tokens + generated)


def generate(model, attention, prompts, steps, forced=None):
    """Greedy decoding of every prompt (token id lists of one length) for `steps` tokens, one
    model step per token for the whole batch, the prompt's tokens included (each a decode
    step). `forced` [batch][steps]: feed these tokens instead of the argmax (teacher forcing);
    the logits are the model's either way."""
    batch, length = len(prompts), len(prompts[0])
    if any(len(p) != length for p in prompts):
        raise ValueError("prompts must be of one length")
    tokens = [list(p) for p in prompts]
    logits = []
    attention.start(batch)
    began = time.perf_counter()
    try:
        with torch.no_grad():
            for position in range(length + steps - 1):
                current = [tokens[b][position] for b in range(batch)]
                out = model.step(current, [position] * batch, attention)
                if position + 1 < length:
                    continue
                logits.append(out)
                t = position + 1 - length
                for b in range(batch):
                    tokens[b].append(int(forced[b][t]) if forced is not None
                                     else int(out[b].argmax()))
    finally:
        attention.release()
    return Generation(tokens, logits, time.perf_counter() - began, length + steps - 1)


def generate_micro_batched(model, make_attention, prompts, steps, micro_batches):
    """Greedy decoding with the batch cut into `micro_batches` that run at once, each with its
    own attention back end (make_attention(i)) on a thread of its own: while one micro-batch
    waits for its attention call, another computes its projections and FFN (torch and gRPC
    release the GIL). The tokens are generate()'s, in the prompts' order; `seconds` is the wall
    time of the whole batch."""
    k = max(1, min(micro_batches, len(prompts)))
    bounds = [len(prompts) * i // k for i in range(k + 1)]
    results, errors = [None] * k, []

    def run(i):
        try:
            results[i] = generate(model, make_attention(i), prompts[bounds[i]:bounds[i + 1]],
                                  steps)
        except Exception as error:  # noqa: BLE001 (raised below, after the others)
            errors.append(error)
    began = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - began
    if errors:
        raise errors[0]
    tokens = [seq for r in results for seq in r.tokens]
    logits = [torch.cat([r.logits[t] for r in results]) for t in range(len(results[0].logits))]
    return Generation(tokens, logits, seconds, results[0].steps)


@dataclasses.dataclass
class Comparison:
    max_logit_difference: float       # over every teacher-forced step
    argmax_mismatches: int            # where the reference's top-2 margin exceeds 4 x tolerance
    near_ties: int                    # steps (x sequences) whose margin was within that
    identical_until: list             # per sequence: free-running tokens equal up to here
    first_near_tie: list              # per sequence: the first step with a margin <= tolerance
    distinct_tokens: list             # per sequence, in the reference's free-running output


def compare_teacher_forced(model, reference, other, prompts, steps, tolerance):
    """Runs `reference` free-running, then both back ends teacher-forced on its tokens; every
    step's logits are compared (max abs difference), and the argmax wherever the reference's
    top-2 margin exceeds 4 x tolerance. Free-running `other` is compared token for token up
    to the first step where the reference's margin is within the tolerance (reported, not
    counted as a mismatch)."""
    free = generate(model, reference, prompts, steps)
    length = len(prompts[0])
    forced = [seq[length:] for seq in free.tokens]
    ref = generate(model, reference, prompts, steps, forced=forced)
    got = generate(model, other, prompts, steps, forced=forced)
    other_free = generate(model, other, prompts, steps)
    worst, mismatches, ties = 0.0, 0, 0
    first_tie = [steps] * len(prompts)
    for t, (a, b) in enumerate(zip(ref.logits, got.logits)):
        worst = max(worst, float((a - b).abs().max()))
        top2 = torch.topk(a, 2, dim=-1).values
        margin = top2[:, 0] - top2[:, 1]
        for s in range(len(prompts)):
            if margin[s] > 4 * tolerance:
                mismatches += int(a[s].argmax() != b[s].argmax())
            else:
                ties += 1
            if margin[s] <= tolerance and first_tie[s] == steps:
                first_tie[s] = t
    identical = []
    for s in range(len(prompts)):
        mine, theirs = free.tokens[s][length:], other_free.tokens[s][length:]
        same = next((t for t in range(steps) if mine[t] != theirs[t]), steps)
        identical.append(same)
    return Comparison(worst, mismatches, ties, identical, first_tie,
                      [len(set(seq[length:])) for seq in free.tokens])
