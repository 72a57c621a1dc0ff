"""A small CNN: convolutions, batch norm, ReLU, max and adaptive average pooling.

    aotc export samples/cnn.py:Net --example-input 8x3x32x32
"""
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, classes: int = 10, width: int = 32):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1, bias=False), nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.Conv2d(2 * width, 2 * width, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(2 * width, classes)

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))
