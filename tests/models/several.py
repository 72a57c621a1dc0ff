"""A file defining several models (and a helper), for the "no such name" error."""
import torch
from torch import nn

WIDTH = 4


class Alpha(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return self.fc(x)


class Beta(Alpha):
    def forward(self, x):
        return self.fc(x).relu()


def make_gamma():
    return Alpha()
