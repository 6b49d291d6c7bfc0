"""Batched greedy decoding with either attention back end, and the comparison of two back
ends: teacher-forced logits step by step, and free-running output up to the first near-tie."""

import dataclasses
import time

import torch

from mlaserve.model.attention import LocalAttention


@dataclasses.dataclass
class Generation:
    tokens: list          # per sequence: prompt + generated token ids
    logits: list          # per step after the prompt: [batch, vocab] float32
    seconds: float        # wall time of the decode steps (prompt included)
    steps: int            # model steps run (prompt tokens decoded + generated)


def prefix_rows(model, tokens):
    """Every layer's KV rows [layers, len(tokens), latent + rope] of one prompt, as a
    framework's prefill hands them to the decode side (here token by token with local
    attention): a shared prompt's prefix, registered once for every sequence on it."""
    local = LocalAttention(model)
    local.start(1)
    with torch.no_grad():
        for position, token in enumerate(tokens):
            model.step([token], [position], local)
    return local.held_rows(0)


def generate(model, attention, prompts, steps, forced=None, shared_prefix=False):
    """Greedy decoding of every prompt (token id lists of one length) for `steps` tokens, one
    model step per token for the whole batch, the prompt's tokens included (each a decode
    step). `forced` [batch][steps]: feed these tokens instead of the argmax (teacher forcing);
    the logits are the model's either way. shared_prefix: the prompts agree but for their
    last token (a shared system prompt, then each sequence's own): the shared tokens are
    prefilled once (prefix_rows) and handed to the back end as a prefix every sequence starts
    on; decoding starts at the last prompt token."""
    return generate_micro_batched(model, lambda i: attention, prompts, steps, 1, forced,
                                  shared_prefix)


def generate_micro_batched(model, make_attention, prompts, steps, micro_batches, forced=None,
                           shared_prefix=False):
    """generate() with the batch cut into `micro_batches`, each with its own attention back
    end (make_attention(i)), run as a ping-pong on this one thread: each micro-batch submits
    a layer's attention and yields to the next, which finishes its own previous layer (its
    call's answer, o_proj, FFN) and submits its next, so one micro-batch's call is in flight
    while another's layers compute. The tokens are generate()'s, in the prompts' order;
    `seconds` is the wall time of the whole batch."""
    batch, length = len(prompts), len(prompts[0])
    if any(len(p) != length for p in prompts):
        raise ValueError("prompts must be of one length")
    if shared_prefix and any(p[:-1] != prompts[0][:-1] for p in prompts):
        raise ValueError("shared_prefix needs prompts that agree but for their last token")
    k = max(1, min(micro_batches, batch))
    bounds = [batch * i // k for i in range(k + 1)]
    slices = [range(bounds[i], bounds[i + 1]) for i in range(k)]
    prefix = prefix_rows(model, prompts[0][:-1]) if shared_prefix and length > 1 else None
    first = 0 if prefix is None else prefix.shape[1]
    tokens = [list(p) for p in prompts]
    logits = []
    backends = [make_attention(i) for i in range(k)]
    try:
        for i, backend in enumerate(backends):
            backend.start(len(slices[i]), prefix=prefix)
        began = time.perf_counter()
        with torch.no_grad():
            for position in range(first, length + steps - 1):
                out = _ping_pong(model, backends, [[tokens[b][position] for b in s]
                                                   for s in slices], position)
                if position + 1 < length:
                    continue
                logits.append(out)
                t = position + 1 - length
                chosen = out.argmax(dim=-1).tolist()
                for b in range(batch):
                    tokens[b].append(int(forced[b][t]) if forced is not None else chosen[b])
        seconds = time.perf_counter() - began
    finally:
        for backend in backends:
            backend.release()
    return Generation(tokens, logits, seconds, length + steps - 1 - first)


def _ping_pong(model, backends, tokens, position):
    """One model step of every micro-batch (tokens[i] for backends[i]), interleaved layer by
    layer; the logits of all, in order."""
    def micro_batch(i):
        positions = [position] * len(tokens[i])
        x, at = model.embed(tokens[i], positions)
        for layer in range(model.config.num_hidden_layers):
            q_nope, q_pe, rows = model.attention_inputs(layer, x, at)
            handle = backends[i].submit(layer, q_nope, q_pe, rows, positions)
            yield
            x = model.finish_layer(layer, x, handle.result())
        return model.logits(x)

    running = [micro_batch(i) for i in range(len(backends))]
    for r in running:
        next(r)  # to its first call
    logits = [None] * len(running)
    while any(r is not None for r in running):
        for i, r in enumerate(running):
            if r is None:
                continue
            try:
                next(r)
            except StopIteration as stop:
                logits[i], running[i] = stop.value, None
    return torch.cat(logits)


@dataclasses.dataclass
class Comparison:
    max_logit_difference: float       # over every teacher-forced step
    argmax_mismatches: int            # where the reference's top-2 margin exceeds 4 x tolerance
    near_ties: int                    # steps (x sequences) whose margin was within that
    identical_until: list             # per sequence: free-running tokens equal up to here
    first_near_tie: list              # per sequence: the first step with a margin <= tolerance
    distinct_tokens: list             # per sequence, in the reference's free-running output


def compare_teacher_forced(model, reference, other, prompts, steps, tolerance,
                           shared_prefix=False):
    """Runs `reference` free-running, then both back ends teacher-forced on its tokens; every
    step's logits are compared (max abs difference), and the argmax wherever the reference's
    top-2 margin exceeds 4 x tolerance. Free-running `other` is compared token for token up
    to the first step where the reference's margin is within the tolerance (reported, not
    counted as a mismatch)."""
    def run(backend, forced=None):
        return generate(model, backend, prompts, steps, forced, shared_prefix)
    free = run(reference)
    length = len(prompts[0])
    forced = [seq[length:] for seq in free.tokens]
    ref = run(reference, forced)
    got = run(other, forced)
    other_free = run(other)
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
