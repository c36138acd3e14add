"""A resumed run trains on the uninterrupted run's batches (ExactResumeHook).

Each case trains once without interruption, writing a checkpoint every
epoch (iteration), and then resumes from one of those very checkpoints in a
new work dir, as a user resumes a run that died. The batches after the
checkpoint (sample order and the augmentation each sample got) must be the
uninterrupted run's. The same resume on the stock path differs, which is
what makes each case a test of the hook.
"""
from typing import Dict

import pytest
from order_utils import assert_same_batches, batch_ids, train, write_ann_files

#: A video set: TrackImgSampler shuffles with the seed, and the pipeline's
#: UniformRefFrameSample draws a reference frame at random for each sample.
CASE = 'TrackImgSampler'
PER_EPOCH = 8


@pytest.fixture(scope='module')
def ann_files(tmp_path_factory) -> Dict[str, str]:
    """The annotation files, written once for this module."""
    return write_ann_files(tmp_path_factory.mktemp('resume_epoch'))


def resume_pair(files, tmp_path, fast: bool, loop: str, **kw):
    """(batches after the checkpoint: uninterrupted, resumed)."""
    if loop == 'epoch':
        kw.update(epochs=3)
        ckpt, skip = 'epoch_2.pth', 2 * PER_EPOCH
    else:
        kw.update(iters=7)
        ckpt, skip = 'iter_4.pth', 4
    full = train(files, tmp_path / 'full', CASE, loop, fast=fast,
                 checkpoints=True, **kw)
    resumed = train(files, tmp_path / 'resumed', CASE, loop, fast=fast,
                    resume_from=str(tmp_path / 'full' / ckpt), **kw)
    return full.batches[skip:], resumed.batches


@pytest.mark.parametrize('loop,workers,seed', [
    ('epoch', 2, None),  # no fixed seed: loaders get the checkpoint's
    ('epoch', 0, 7),  # pipeline in the main process: its random states
    ('iter', 2, None),
])
def test_resume_trains_on_the_uninterrupted_batches(ann_files, tmp_path,
                                                    loop, workers, seed):
    full, resumed = resume_pair(ann_files, tmp_path / 'fast', True, loop,
                                workers=workers, seed=seed, persistent=False)
    assert len(resumed) == len(full) > 0
    assert_same_batches(_Record(full), _Record(resumed))

    full, resumed = resume_pair(ann_files, tmp_path / 'stock', False, loop,
                                workers=workers, seed=seed, persistent=False)
    assert [batch_ids(b) for b in full] != [batch_ids(b) for b in resumed]


def test_persistent_workers_resume_is_named_inexact(ann_files, tmp_path):
    resume_pair(ann_files, tmp_path, True, 'epoch', workers=2, seed=7,
                persistent=True)
    text = ''.join(p.read_text()
                   for p in (tmp_path / 'resumed').glob('*/*.log'))
    assert 'this resumed run will not be identical' in text
    assert 'persistent_workers=True' in text


class _Record:
    """What assert_same_batches compares: a list of batches."""

    def __init__(self, batches: list) -> None:
        self.batches = batches
