"""Ring all-reduce on torch.distributed point-to-point ops: the collective the cost model prices.

The cost model's all-reduce (DESIGN.md) is the bandwidth-optimal ring that
NCCL runs: ``p - 1`` reduce-scatter steps and ``p - 1`` all-gather steps, each
moving one ``n / p`` chunk to the next rank, ``2(p-1) alpha + 2(p-1)/p n / beta``.
gloo's own ``all_reduce`` is another algorithm: over the emulated WAN it
measured 25-32% slower than the cost model on data-parallel plans (default
topology, gpt3-350m and gpt3-125m gradients, 2 and 3 clusters), so a plan's
sync would test gloo, not the plan. :func:`ring_all_reduce` runs the ring
itself with real tensors and real additions.

Every receive of the ring is posted before the first send, each into its own
buffer: gloo's send/recv is a rendezvous (the sender waits for the receiver's
"ready", which crosses the link), so a receive posted only when its step
begins costs every step a second one-way latency (a first version measured
250 ms per step on a ring whose slowest hop is 115 ms).
"""

from __future__ import annotations


def ring_all_reduce(tensor, ranks: list[int], me: int, dist, group=None) -> None:
    """Sum ``tensor`` (1-D, length a multiple of ``len(ranks)``) over ``ranks`` in place, as a ring.

    ``ranks`` are global ranks in ring order; ``group`` (their process group) keeps the ring's
    messages on its own connections, apart from the pipeline's."""
    p = len(ranks)
    if p == 1:
        return
    i = ranks.index(me)
    nxt, prv = ranks[(i + 1) % p], ranks[(i - 1) % p]
    chunks = list(tensor.chunk(p))
    inbox = [chunks[0].new_empty(chunks[0].shape) for _ in range(2 * (p - 1))]
    works = [dist.irecv(buf, src=prv, group=group) for buf in inbox]  # in order: messages match in order
    for step in range(p - 1):  # reduce-scatter: after it, chunk (i + 1) % p holds the full sum
        dist.send(chunks[(i - step) % p], dst=nxt, group=group)
        works[step].wait()
        chunks[(i - step - 1) % p].add_(inbox[step])
    for step in range(p - 1):  # all-gather the summed chunks around the ring
        dist.send(chunks[(i + 1 - step) % p], dst=nxt, group=group)
        works[p - 1 + step].wait()
        chunks[(i - step) % p].copy_(inbox[p - 1 + step])
