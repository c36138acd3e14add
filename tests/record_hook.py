"""A hook the launcher tests' configs import (``custom_imports``): each rank
writes what it trained to ``$FP_RECORD_DIR/rank<r>.json`` when training ends
(nothing without the variable).

The record is the parity recorder's (``fast_parallel.parity.recorder``):
per iteration the batch's sample ids and the loss terms, per step the
gradient norm; plus SHA-256s of the final parameters and buffers, and of
every ``EMAHook``'s averaged model, bit for bit.
"""
import hashlib
import json
import os

from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from fast_parallel.parity.recorder import ParityRecorderHook


@HOOKS.register_module()
class RankRecordHook(Hook):
    """Writes this rank's training record (see the module)."""

    priority = 'LOWEST'

    def __init__(self) -> None:
        self.record: dict = {}
        self.recorder = ParityRecorderHook(self.record)

    def before_train(self, runner) -> None:
        self.recorder.before_train(runner)

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self.recorder.before_train_iter(runner, batch_idx, data_batch)

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        self.recorder.after_train_iter(runner, batch_idx, data_batch, outputs)

    def after_train(self, runner) -> None:
        out = os.environ.get('FP_RECORD_DIR')
        if not out:
            return
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        digest = hashlib.sha256()
        each = {}
        for name, tensor in sorted(model.state_dict().items()):
            data = tensor.detach().cpu().contiguous().numpy().tobytes()
            digest.update(name.encode())
            digest.update(data)
            each[name] = hashlib.sha256(data).hexdigest()[:16]
        emas = hashlib.sha256()
        for hook in runner.hooks:
            if hasattr(hook, 'ema_model'):
                for name, tensor in sorted(
                        hook.ema_model.state_dict().items()):
                    emas.update(name.encode())
                    emas.update(
                        tensor.detach().cpu().contiguous().numpy().tobytes())
        record = dict(
            rank=runner.rank,
            world_size=runner.world_size,
            start_iter=runner.iter - len(self.record['order']),
            order=self.record['order'],
            losses=self.record['losses'],
            grad_norm=self.record['grad_norm'],
            params=digest.hexdigest(),
            ema=emas.hexdigest(),
            each_param=each)
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f'rank{runner.rank}.json'), 'w') as f:
            json.dump(record, f)
