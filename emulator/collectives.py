"""Ring all-reduce on torch.distributed point-to-point ops: the collective the cost model prices.

The cost model's all-reduce (DESIGN.md) is the bandwidth-optimal ring that
NCCL runs: ``p - 1`` reduce-scatter steps and ``p - 1`` all-gather steps, each
moving one ``n / p`` chunk to the next rank, ``2(p-1) alpha + 2(p-1)/p n / beta``.
gloo's own ``all_reduce`` is another algorithm: over the emulated WAN it
measured 25-32% slower than that ring on data-parallel plans (default topology,
gpt3-350m and gpt3-125m gradients, 2 and 3 clusters), so a plan's sync would
test gloo, not the plan. :func:`ring_all_reduce` runs the ring itself with
real tensors and real additions; each step's receive is posted before its
send (gloo's send/recv is a rendezvous, see ``emulator.worker._post_receives``).
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
    incoming = chunks[0].clone()
    for step in range(p - 1):  # reduce-scatter: after it, chunk (i + 1) % p holds the full sum
        send, recv = chunks[(i - step) % p], chunks[(i - step - 1) % p]
        work = dist.irecv(incoming, src=prv, group=group)
        dist.send(send, dst=nxt, group=group)
        work.wait()
        recv.add_(incoming)
    for step in range(p - 1):  # all-gather the summed chunks around the ring
        send, recv = chunks[(i + 1 - step) % p], chunks[(i - step) % p]
        work = dist.irecv(recv, src=prv, group=group)
        dist.send(send, dst=nxt, group=group)
        work.wait()
