"""GPipe on gloo with plain send/recv: all micro-batches forward through the stages, then all backward.

Stage s receives each micro-batch's activations from rank - 1 (a shape header, then the tensors), runs its
blocks and sends the result to rank + 1; the last stage computes the loss. Backward runs the micro-batches in
reverse: the last stage backpropagates its loss, every stage sends the gradients of its inputs back. Gradients
accumulate in the stage's parameters exactly as in the unsplit model run on the same micro-batches.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def send_tensors(tensors: tuple[torch.Tensor, ...], dst: int) -> None:
    """Shapes first (an int64 header), then each float32 tensor."""
    header = [len(tensors)]
    for t in tensors:
        header += [t.dim(), *t.shape]
    header_t = torch.tensor(header, dtype=torch.int64)
    dist.send(torch.tensor([header_t.numel()], dtype=torch.int64), dst)
    dist.send(header_t, dst)
    for t in tensors:
        dist.send(t.detach().float().cpu().contiguous(), dst)  # activations travel through gloo


def recv_tensors(src: int) -> tuple[torch.Tensor, ...]:
    length = torch.zeros(1, dtype=torch.int64)
    dist.recv(length, src)
    header = torch.zeros(int(length), dtype=torch.int64)
    dist.recv(header, src)
    values = header.tolist()
    count, pos, out = values[0], 1, []
    for _ in range(count):
        ndim = values[pos]
        shape = values[pos + 1 : pos + 1 + ndim]
        pos += 1 + ndim
        buffer = torch.empty(shape, dtype=torch.float32)
        dist.recv(buffer, src)
        out.append(buffer)
    return tuple(out)


def gpipe_step(stage, micro_inputs, loss_of, topo) -> list:
    """Run one GPipe step of this rank's stage.

    micro_inputs: per micro-batch, the stage input on the first stage (a tuple of tensors), else None;
    loss_of(i, outputs) -> (scalar loss to backpropagate, anything to return), called on the last stage only.
    Returns the per-micro-batch values of loss_of on the last stage, [] elsewhere.
    """
    device = next(stage.parameters()).device
    saved, results = [], []
    for i, given in enumerate(micro_inputs):
        if topo.first_stage:
            inputs = given
        else:
            inputs = tuple(t.to(device).requires_grad_() for t in recv_tensors(topo.prev_rank))
        outputs = stage(inputs)
        if topo.last_stage:
            loss, result = loss_of(i, outputs)
            results.append(result)
            saved.append((inputs, loss))
        else:
            send_tensors(outputs, topo.next_rank)
            saved.append((inputs, outputs))
    for inputs, outputs in reversed(saved):
        if topo.last_stage:
            outputs.backward()
        else:
            grads = tuple(g.to(device) for g in recv_tensors(topo.next_rank))
            torch.autograd.backward(outputs, grads)
        if not topo.first_stage:
            send_tensors(tuple(t.grad if t.grad is not None else torch.zeros_like(t) for t in inputs), topo.prev_rank)
    return results
