"""The PyTorch side of the benchmarks: one training or inference step of a torch model."""
from __future__ import annotations


def torch_step(torch, model, x, y, phase: str):
    """A callable running one SGD step (phase 'train') or one no-grad forward pass."""
    if phase == "train":
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
        loss_fn = torch.nn.CrossEntropyLoss()

        def step():
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        return step
    model.eval()

    def step():
        with torch.no_grad():
            model(x)
    return step
