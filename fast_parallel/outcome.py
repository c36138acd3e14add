"""``Outcome``: what switching one part of a run to the fast path did.

Each room decides for its own parts (a DataLoader, the optimizer, an
averaged model, the heads) and says what it did with an :class:`Outcome`;
``FastParallelHook`` joins them into its start-of-training line and reads
their fields, never their sentences.
"""
from dataclasses import dataclass
from typing import Optional, Tuple

__all__ = ['Outcome']


@dataclass(frozen=True)
class Outcome:
    """One part on the fast path, or left stock and why.

    ``str(outcome)`` is the part's words in the start-of-training line.

    Args:
        name (str): The part, as the line names it: ``'train'`` (a loop's
            DataLoader), ``'optimizer'``, ``'EMA (ExpMomentumEMA)'``,
            ``'targets'``, ``'YOLOXHead/SimOTAAssigner'`` (one head).
        done (bool): Whether the part takes the fast path; for a part made
            of parts, whether any of them does.
        why (str, optional): Why it stays stock, in full (for a warning);
            None when done.
        text (str): The line's words for it. Defaults to
            ``'<name>: left stock (<why>)'``, the words of a part switched
            off by an option.
        short (str, optional): ``why`` in a few words, where the line gives
            it shorter than a warning does. Defaults to ``why``.
        parts (tuple[Outcome]): The outcomes it is made of (one per head,
            one per optimizer of an ``OptimWrapperDict``). Defaults to ().
    """
    name: str
    done: bool
    why: Optional[str] = None
    text: str = ''
    short: Optional[str] = None
    parts: Tuple['Outcome', ...] = ()

    def __post_init__(self) -> None:
        if self.short is None:
            object.__setattr__(self, 'short', self.why)
        if not self.text:
            text = (f'{self.name}: on' if self.done else
                    f'{self.name}: left stock ({self.short})')
            object.__setattr__(self, 'text', text)

    def __str__(self) -> str:
        return self.text
