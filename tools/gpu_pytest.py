"""pytest plugin of tools/gpu_suite.sh (`-p gpu_pytest`, with tools/ on PYTHONPATH): with
LONGPACK_TEST_DEVICE=cuda, CUDA is the test process's default device (torch.set_default_device),
so the archs tests, which build their models and inputs without naming a device, run them on the
GPU (FlexAttention for document masks there) with their own assertions. Nothing else changes;
without the variable (or with cpu) the plugin does nothing."""

import os


def pytest_configure(config):
    device = os.environ.get("LONGPACK_TEST_DEVICE")
    if device and device != "cpu":
        import torch

        torch.set_default_device(device)


def pytest_report_header(config):
    return f"default device (tools/gpu_pytest.py): {os.environ.get('LONGPACK_TEST_DEVICE') or 'cpu'}"
