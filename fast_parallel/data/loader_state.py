"""``LoaderState``: what fast_parallel keeps about one DataLoader.

One per DataLoader, made on first use by :func:`loader_state` and owned by
this room: the fast iterators read the base seed, the packed collate
function reads whether to report its worker's random states, and the
rooms above set them (``ExactResumeHook`` asks for worker states with
:func:`carry_worker_states`).
"""
import weakref
from typing import Optional

from torch.utils.data import DataLoader

__all__ = [
    'LoaderState', 'loader_state', 'carry_worker_states',
    'take_inherited_base_seed'
]


class LoaderState:
    """What fast_parallel keeps about one DataLoader, beside torch's own.

    Args:
        base_seed (int, optional): The base seed the loader's next fast
            iterator gives its workers instead of the one it draws (it
            still draws it, so torch's global generator moves as in stock):
            a rebuilt loader's predecessor's, or a checkpoint's while a
            resumed run starts its workers. Defaults to None: torch's own.
        carries_worker_states (bool): Whether its batches carry the random
            states of the worker that made them
            (``PackedBatch.worker_states``), where its collate function is
            fast_parallel's. Defaults to False.
    """

    __slots__ = ('base_seed', 'carries_worker_states', 'worker_pids')

    def __init__(self,
                 base_seed: Optional[int] = None,
                 carries_worker_states: bool = False) -> None:
        self.base_seed = base_seed
        self.carries_worker_states = carries_worker_states
        #: The process ids of the workers its latest fast iterator started
        #: (for the data-bound line; not carried to workers).
        self.worker_pids: tuple = ()

    def __getstate__(self) -> tuple:
        # Collate functions carry it to spawned workers.
        return self.base_seed, self.carries_worker_states

    def __setstate__(self, state: tuple) -> None:
        self.base_seed, self.carries_worker_states = state
        self.worker_pids = ()

    def __repr__(self) -> str:
        return (f'LoaderState(base_seed={self.base_seed}, '
                f'carries_worker_states={self.carries_worker_states})')


#: Each DataLoader's state, for as long as the DataLoader lives.
_STATES: 'weakref.WeakKeyDictionary[DataLoader, LoaderState]' = \
    weakref.WeakKeyDictionary()


def loader_state(loader: DataLoader) -> LoaderState:
    """The state of a DataLoader (a new, default one the first time).

    Args:
        loader (DataLoader): The DataLoader.

    Returns:
        LoaderState: Its state, the same object every time.
    """
    state = _STATES.get(loader)
    if state is None:
        state = _STATES[loader] = LoaderState()
    return state


def carry_worker_states(loader: DataLoader) -> None:
    """Makes the loader's batches carry their worker's random states.

    Only a collate function fast_parallel put in place
    (:func:`~fast_parallel.data.loader.prepare_loader`) reports them, from
    the next iterator on; it may be put in place before or after this.

    Args:
        loader (DataLoader): The DataLoader.
    """
    loader_state(loader).carries_worker_states = True


def take_inherited_base_seed(loader: DataLoader) -> Optional[int]:
    """The base seed a loader's next fast iterator uses instead of its
    own, taken: the iterators after it draw their own, as stock's do (a new
    one per pass over the data without persistent workers).

    Args:
        loader (DataLoader): The DataLoader.

    Returns:
        int | None: :attr:`LoaderState.base_seed` (now None); None for a
        loader without one.
    """
    state = _STATES.get(loader)
    if state is None:
        return None
    seed, state.base_seed = state.base_seed, None
    return seed
