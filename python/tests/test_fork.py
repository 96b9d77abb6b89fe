"""Processes forked after rnnc ran on several threads: a multiprocessing pool and a DataLoader's
workers run the parent's layers on threads of their own. They used to wait forever at the first
barrier of their first run: fork() copies only the calling thread, and the teams that the parent's
runs left idle had no threads in the child."""

import multiprocessing

import numpy as np
import pytest

import rnnc

# What the forked workers run: theirs by inheritance, as a dataset's model is a DataLoader's.
_inherited = {}


def _input(seed):
    return np.random.default_rng(seed).standard_normal((20, 4, 32)).astype(np.float32)


def _run_inherited(seed):
    y, _ = _inherited["lstm"](_input(seed))
    return seed, y


def test_a_forked_pool_runs_the_parents_layer_on_threads():
    lstm = rnnc.LSTM(32, 48, threads=2)
    _inherited["lstm"] = lstm
    expected = {seed: lstm(_input(seed))[0] for seed in range(4)}
    with multiprocessing.get_context("fork").Pool(2) as pool:
        results = pool.map_async(_run_inherited, range(4)).get(timeout=60)
    for seed, y in results:
        np.testing.assert_array_equal(y, expected[seed])
    np.testing.assert_array_equal(lstm(_input(0))[0], expected[0])


def test_dataloader_workers_run_an_rnnc_module():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    reference = torch.nn.GRU(16, 24)
    model = rnnc.nn.GRU(16, 24, threads=2)
    model.load_state_dict(reference.state_dict())
    inputs = torch.randn(6, 10, 3, 16)
    with torch.no_grad():
        model(inputs[0])  # the parent runs first, as a model evaluated before training does

    class Encoded(torch.utils.data.Dataset):
        def __len__(self):
            return len(inputs)

        def __getitem__(self, i):
            with torch.no_grad():
                return model(inputs[i])[0]

    loader = torch.utils.data.DataLoader(Encoded(), batch_size=None, num_workers=2, timeout=60,
                                         multiprocessing_context="fork")
    for i, y in enumerate(loader):
        with torch.no_grad():
            torch.testing.assert_close(y, reference(inputs[i])[0], atol=1e-5, rtol=1e-5)


def _training_input(torch, seed):
    return torch.randn(7, 3, 16, generator=torch.Generator().manual_seed(seed))


def _train_inherited(seed):
    torch = _inherited["torch"]
    model = _inherited["model"]
    x = _training_input(torch, seed)
    model.zero_grad()
    model(x)[0].pow(2).sum().backward()
    return seed, [p.grad.clone() for p in model.parameters()]


def test_a_forked_pool_trains_the_parents_module_on_threads():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    reference = torch.nn.LSTM(16, 24, num_layers=2)
    model = rnnc.nn.LSTM(16, 24, num_layers=2, threads=2)
    model.load_state_dict(reference.state_dict())
    _inherited.update(torch=torch, model=model)
    _train_inherited(99)  # the parent trains first: its forward and backward leave teams idle
    with multiprocessing.get_context("fork").Pool(2) as pool:
        results = pool.map_async(_train_inherited, range(3)).get(timeout=60)
    for seed, grads in results:
        x = _training_input(torch, seed)
        reference.zero_grad()
        reference(x)[0].pow(2).sum().backward()
        for got, want in zip(grads, reference.parameters()):
            torch.testing.assert_close(got, want.grad, atol=1e-4, rtol=1e-4)
