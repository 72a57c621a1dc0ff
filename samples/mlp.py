"""A small MLP: linear layers with GELU and a residual connection."""
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, dim: int = 64, hidden: int = 256, classes: int = 10):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.head = nn.Linear(dim, classes)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        h = x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))
        return self.head(self.norm(h))
