"""The suite's guard (tests/conftest.py): a test that leaves process-wide state changed errors, naming what it
leaked, and the next test starts from the state before it."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

LEAKING_TESTS = '''
import logging
import os

import torch

import pacs.metric.common.errors as errors
from pacs.rewards.registry import REWARDS

START = os.getcwd()


def test_a_sets_an_environment_variable():
    os.environ["PACS_LEAK"] = "1"


def test_b_sees_no_environment_variable():
    assert "PACS_LEAK" not in os.environ


def test_c_replaces_a_module_attribute():
    errors.InputError = None


def test_d_sees_the_original_attribute():
    assert errors.InputError is not None and issubclass(errors.InputError, Exception)


def test_e_changes_torch_threads():
    torch.set_num_threads(torch.get_num_threads() + 1)


def test_f_adds_a_logging_handler():
    logging.getLogger("pacs.metric.leak").addHandler(logging.NullHandler())


def test_g_registers_a_reward():
    REWARDS["leak"] = lambda **context: None


def test_h_sees_no_registered_reward():
    assert "leak" not in REWARDS and not logging.getLogger("pacs.metric.leak").handlers


def test_i_changes_directory(tmp_path):
    os.chdir(tmp_path)


def test_j_sets_the_default_dtype():
    torch.set_default_dtype(torch.float64)


def test_k_sees_the_state_before():
    assert torch.get_default_dtype() == torch.float32 and os.getcwd() == START
'''


def test_a_leaking_test_errors_and_the_next_one_starts_clean(pytester: pytest.Pytester) -> None:
    pytester.makeconftest((Path(__file__).resolve().parents[1] / "conftest.py").read_text())
    pytester.makepyfile(test_leaks=LEAKING_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=11, errors=7)
    result.stdout.fnmatch_lines_random([
        "*test_a_sets_an_environment_variable left global state changed*environment variables*PACS_LEAK*",
        "*test_c_replaces_a_module_attribute left global state changed*attribute pacs.metric.common.errors.InputError*",
        "*test_e_changes_torch_threads left global state changed*torch thread count*",
        "*test_f_adds_a_logging_handler left global state changed*logger 'pacs.metric.leak'*",
        "*test_g_registers_a_reward left global state changed*registry pacs.rewards.registry.REWARDS entries*leak*",
        "*test_i_changes_directory left global state changed*working directory*",
        "*test_j_sets_the_default_dtype left global state changed*torch default dtype torch.float64*",
    ])
