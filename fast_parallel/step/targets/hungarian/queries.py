"""DINO's denoising queries (``CdnQueryGenerator``) without a loop per image
or per group: stock's tensors and noise draws.

Stock normalises each image's boxes by its own ``[w, h, w, h]``, builds the
image index of every box with one ``full_like`` per image, counts each
image's boxes again on the device (``torch.sum(batch_idx == i)``, read back
by ``max`` and ``arange``: host syncs), and writes the attention mask one
group at a time. :class:`FastCdnQueryGenerator` divides all boxes at once
by their image's factor (the same correctly rounded division per element),
takes the counts from the host (stock's ``len`` of each image's boxes),
makes every index tensor on the host and copies them in one copy, and
writes the mask as "group of the row != group of the column". The noise is
drawn by stock's own ``generate_dn_label_query`` /
``generate_dn_bbox_query`` on the same tensors, in stock's order. A batch
it does not cover goes stock's way, counted. Why each step is exact:
``docs/targets_hungarian.md``.
"""
from typing import Any, Optional, Sequence, Tuple

import torch
from mmdet.models.layers.transformer import CdnQueryGenerator
from torch import Tensor

from fast_parallel.step.targets.padding import to_device
from fast_parallel.step.targets.stats import TargetStats

__all__ = ['FastCdnQueryGenerator', 'batch_why', 'switch_queries']


def batch_why(batch_data_samples: Sequence[Any]) -> Optional[str]:
    """None when the batch takes the fast way, else why not."""
    if len(batch_data_samples) == 0:
        return 'an empty batch'
    boxes = []
    for sample in batch_data_samples:
        shape = getattr(sample, 'img_shape', None)
        instances = getattr(sample, 'gt_instances', None)
        if not isinstance(shape, (tuple, list)) or len(shape) != 2:
            return 'an img_shape that is not (h, w)'
        bboxes = getattr(instances, 'bboxes', None)
        labels = getattr(instances, 'labels', None)
        if type(bboxes) is not Tensor or type(labels) is not Tensor or \
                bboxes.dim() != 2 or bboxes.shape[1] != 4 or \
                labels.dim() != 1 or len(labels) != len(bboxes):
            return 'ground truths that are not (n, 4) boxes and n labels'
        boxes.append(bboxes)
        if labels.device != bboxes.device:
            return 'labels and boxes on different devices'
    if len({(b.dtype, b.device) for b in boxes}) != 1 or \
            not boxes[0].is_floating_point():
        return 'boxes of several dtypes or devices'
    return None


class FastCdnQueryGenerator(CdnQueryGenerator):
    """``CdnQueryGenerator`` with the batch's boxes, indices and mask made
    at once (``fast_cdn_stats`` counts the batches)."""

    fast_cdn_stats: Optional[TargetStats] = None

    def __call__(self, batch_data_samples: Sequence[Any]) -> tuple:
        why = batch_why(batch_data_samples)
        if self.fast_cdn_stats is not None:
            self.fast_cdn_stats.add(1, int(why is not None))
        if why is not None:
            return CdnQueryGenerator.__call__(self, batch_data_samples)
        bboxes = [s.gt_instances.bboxes for s in batch_data_samples]
        counts = [len(b) for b in bboxes]
        device = bboxes[0].device
        # stock: each image's boxes / new_tensor([w, h, w, h]).unsqueeze(0)
        factors = bboxes[0].new_tensor(
            [[w, h, w, h]
             for h, w in (s.img_shape for s in batch_data_samples)])
        max_num_target = max(counts)
        num_groups = self.get_num_groups(max_num_target)
        # every index on the host, then one copy: each box's image, and
        # collate_dn_queries' scatter (box k of image b in group g goes to
        # (b, k + max_num_target * g))
        image_of_box = torch.repeat_interleave(
            torch.arange(len(counts)), torch.tensor(counts, dtype=torch.long))
        in_image = torch.cat([torch.arange(n) for n in counts]).long()
        offsets = torch.arange(2 * num_groups).long() * max_num_target
        map_query_index = (offsets[:, None] + in_image[None, :]).view(-1)
        index = to_device(
            torch.cat([
                image_of_box,
                image_of_box.repeat(2 * num_groups), map_query_index
            ]), device)
        batch_idx, batch_idx_expand, map_query_index = index.split(
            [len(image_of_box),
             len(map_query_index),
             len(map_query_index)])
        gt_bboxes = torch.cat(bboxes) / factors[batch_idx]
        gt_labels = torch.cat(
            [s.gt_instances.labels for s in batch_data_samples])
        dn_label_query = self.generate_dn_label_query(gt_labels, num_groups)
        dn_bbox_query = self.generate_dn_bbox_query(gt_bboxes, num_groups)
        dn_label_query, dn_bbox_query = self._collate(
            dn_label_query, dn_bbox_query, (batch_idx_expand, map_query_index),
            len(counts), int(max_num_target * 2 * num_groups))
        attn_mask = self.generate_dn_mask(
            max_num_target, num_groups, device=dn_label_query.device)
        dn_meta = dict(
            num_denoising_queries=int(max_num_target * 2 * num_groups),
            num_denoising_groups=num_groups)
        return dn_label_query, dn_bbox_query, attn_mask, dn_meta

    def _collate(self, input_label_query: Tensor, input_bbox_query: Tensor,
                 mapper: Tuple[Tensor, Tensor], batch_size: int,
                 num_denoising_queries: int) -> tuple:
        """Stock's ``collate_dn_queries`` given its scatter indices."""
        device = input_label_query.device
        batched_label_query = torch.zeros(
            batch_size, num_denoising_queries, self.embed_dims, device=device)
        batched_bbox_query = torch.zeros(
            batch_size, num_denoising_queries, 4, device=device)
        batched_label_query[mapper] = input_label_query
        batched_bbox_query[mapper] = input_bbox_query
        return batched_label_query, batched_bbox_query

    def generate_dn_mask(self, max_num_target: int, num_groups: int,
                         device: Any) -> Tensor:
        """Stock's mask: a denoising query sees its own group only, a
        matching query sees no denoising one; made without the group loop.

        Args:
            max_num_target (int): The most boxes of an image.
            num_groups (int): The denoising groups.
            device: Where the mask goes.

        Returns:
            Tensor: ``(Q, Q)`` bool, True where attention is masked.
        """
        num_denoising_queries = int(max_num_target * 2 * num_groups)
        num_queries_total = num_denoising_queries + self.num_matching_queries
        attn_mask = torch.zeros(
            num_queries_total,
            num_queries_total,
            device=device,
            dtype=torch.bool)
        attn_mask[num_denoising_queries:, :num_denoising_queries] = True
        if num_denoising_queries:
            group = torch.arange(
                num_denoising_queries, device=device) // (2 * max_num_target)
            attn_mask[:num_denoising_queries, :num_denoising_queries] = \
                group[:, None] != group[None, :]
        return attn_mask


def switch_queries(model: Any) -> Optional[TargetStats]:
    """Gives each exact ``CdnQueryGenerator`` of ``model`` the fast class.

    Args:
        model: The model (its modules are walked).

    Returns:
        TargetStats | None: The batches' counter, or None without one.
    """
    stats = None
    for module in model.modules():
        if type(module) is FastCdnQueryGenerator:
            stats = module.fast_cdn_stats
        elif type(module) is CdnQueryGenerator:
            stats = stats or TargetStats('CdnQueryGenerator', 'batches')
            module.__class__ = FastCdnQueryGenerator
            module.fast_cdn_stats = stats
    return stats
