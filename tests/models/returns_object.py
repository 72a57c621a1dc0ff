"""A model that returns an object aotc cannot store in an artifact."""
import torch
from torch import nn


class Result:
    def __init__(self, value):
        self.value = value


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return Result(self.fc(x))
