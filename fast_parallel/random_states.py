"""The main process's random states: Python, NumPy, torch, CUDA."""
import random

import numpy as np
import torch


def random_states() -> dict:
    """The random states of this process: Python, NumPy, torch, CUDA.

    Returns:
        dict: ``python``, ``numpy``, ``torch`` and, where CUDA is
        initialised, ``cuda``.
    """
    states = dict(
        python=random.getstate(),
        numpy=np.random.get_state(),
        torch=torch.get_rng_state())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states['cuda'] = torch.cuda.get_rng_state_all()
    return states


def set_random_states(states: dict) -> None:
    """Puts back what :func:`random_states` returned.

    Args:
        states (dict): From :func:`random_states` (a worker's torch state
            may travel as a NumPy array).
    """
    random.setstate(states['python'])
    np.random.set_state(states['numpy'])
    # a checkpoint loaded with map_location='cuda' (Runner.resume on a GPU)
    # brings the state tensors to the device; the setters take CPU bytes
    torch.set_rng_state(torch.as_tensor(states['torch']).cpu())
    if 'cuda' in states and torch.cuda.is_available():
        cuda = [torch.as_tensor(state).cpu() for state in states['cuda']]
        if len(cuda) != torch.cuda.device_count():
            raise RuntimeError(
                f'the checkpoint holds the random states of {len(cuda)} '
                f'GPUs, this process sees {torch.cuda.device_count()}')
        torch.cuda.set_rng_state_all(cuda)
