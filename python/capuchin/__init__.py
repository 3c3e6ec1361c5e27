"""Capuchin for PyTorch: train an unmodified model under a memory budget.

    import capuchin
    mgr = capuchin.Manager(budget="50%", job="resnet50")
    for batch in loader:
        with mgr.step():
            loss = model(batch).sum(); loss.backward(); opt.step(); opt.zero_grad()
    print(mgr.report())
"""
from ._client import Client, Error, socket_path  # noqa: F401
from .manager import Manager, parse_budget  # noqa: F401

__all__ = ["Manager", "parse_budget", "Client", "Error", "socket_path"]
