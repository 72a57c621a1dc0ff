"""A model whose forward fails when run eagerly on a (2, 4) input."""
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        return h.view(3, 5)  # EAGER-FAILURE
