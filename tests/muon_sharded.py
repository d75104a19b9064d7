"""Muon on FSDP-sharded parameters against Muon on whole ones, given the same gradients (run by
tests/test_train_fsdp.py under torchrun, 2 processes):

    torchrun --standalone --nproc-per-node 2 tests/muon_sharded.py PRESET [PRESET ...]

prints, for each preset in turn (one launch: a launch costs ~9 s), the largest difference of the
parameters after 3 steps. The gradients of the sharded
model are the whole model's, sharded: so the only difference left is the update itself (a
full run differs more: torch's Newton-Schulz runs in bf16, which turns the gradients' float
rounding of another reduction order into differences of ~1e-3)."""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import distribute_tensor

from longpack import archs
from longpack.training.optim import MUON, Muon


def build(name: str, shard: bool):
    torch.manual_seed(0)
    model = archs.build(name, vocab_size=300)
    if shard:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    params = dict(model.named_parameters())
    matrices = {n: params[n] for n, role in model.param_roles().items() if role in MUON}
    return model, matrices, Muon(list(matrices.values()), lr=0.02, weight_decay=0.1)


def compare(name: str) -> None:
    whole, whole_params, whole_opt = build(name, shard=False)
    _, sharded_params, sharded_opt = build(name, shard=True)
    g = torch.Generator().manual_seed(1)
    worst = 0.0
    for _ in range(3):
        ids = torch.randint(0, 300, (4, 33), generator=g)
        whole.loss(ids[:, :-1], ids[:, 1:])["loss"].backward()
        for n, p in sharded_params.items():
            p.grad = distribute_tensor(whole_params[n].grad, p.device_mesh, p.placements,
                                       src_data_rank=None)
        for opt in (whole_opt, sharded_opt):
            opt.step()
            opt.zero_grad()
        worst = max(worst, max((whole_params[n].detach() - p.full_tensor()).abs().max().item()
                               for n, p in sharded_params.items()))
    if dist.get_rank() == 0:
        print(f"{name} max diff {worst!r}", flush=True)


def main(names: list[str]) -> None:
    dist.init_process_group("gloo")
    try:
        for name in names:
            compare(name)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
