"""A model whose control flow depends on tensor values: strict export must refuse it."""
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        if y.sum() > 0:  # DATA-DEPENDENT
            return y.relu()
        return -y
