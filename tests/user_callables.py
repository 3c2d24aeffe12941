"""Callables a config names by import path in tests/test_config.py: good and bad ones."""

from torch import nn


def no_args():
    return None


def two_args(a, b):
    return None


def broken_model(num_classes):
    raise RuntimeError("boom: the user's constructor failed")


def not_a_module(num_classes):
    return 3


def linear_model(num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, num_classes))
