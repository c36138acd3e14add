"""A small, deterministic COCO set: drawn shapes, real categories.

What it writes and why: ``docs/sample_data.md``.
"""
import json
from pathlib import Path
from typing import List, NamedTuple, Optional, Tuple

import cv2
import numpy as np

from fast_parallel.bench.sample_data.common import all_exist, seeded_rng

#: Standard COCO ids of the 80 detection categories, in mmdet's class order.
COCO_CATEGORY_IDS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16, 17, 18,
                     19, 20, 21, 22, 23, 24, 25, 27, 28, 31, 32, 33, 34, 35,
                     36, 37, 38, 39, 40, 41, 42, 43, 44, 46, 47, 48, 49, 50,
                     51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64,
                     65, 67, 70, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82,
                     84, 85, 86, 87, 88, 89, 90)


class CocoShape(NamedTuple):
    """One drawn category."""
    name: str  #: mmdet's class name
    shape: str  #: ``'ellipse'`` or ``'rectangle'``
    colour: Tuple[int, int, int]  #: BGR
    aspect: Tuple[float, float]  #: range of width / height


#: The drawn categories.
COCO_SHAPES = (
    CocoShape('person', 'ellipse', (60, 60, 220), (0.35, 0.6)),
    CocoShape('car', 'rectangle', (200, 90, 40), (1.4, 2.2)),
    CocoShape('dog', 'ellipse', (40, 140, 180), (1.3, 1.8)),
    CocoShape('sports ball', 'ellipse', (40, 220, 240), (1.0, 1.0)),
)
#: The files whose presence (and ``info``) marks a complete set.
COCO_OUTPUTS = ('annotations/instances_train2017.json',
                'annotations/instances_val2017.json')
#: Default least and largest side of the sample COCO images, in pixels.
COCO_SIZE = (128, 160)

Box = Tuple[int, int, int, int]


def _place_box(rng: np.random.Generator, width: int, height: int,
               aspect: Tuple[float, float], taken: List[Box]) -> Optional[Box]:
    """Picks an inclusive pixel box clear of the others (2 px apart).

    Args:
        rng (np.random.Generator): The image's generator.
        width (int): Image width.
        height (int): Image height.
        aspect (tuple[float, float]): Range of width / height.
        taken (list[tuple]): Boxes already placed.

    Returns:
        tuple | None: ``(x0, y0, x1, y1)``, or None after 50 tries.
    """
    for _ in range(50):
        h = int(rng.integers(16, min(width, height) // 2))
        w = max(8, min(width - 4, int(round(h * rng.uniform(*aspect)))))
        x0 = int(rng.integers(1, width - w))
        y0 = int(rng.integers(1, height - h))
        box = (x0, y0, x0 + w - 1, y0 + h - 1)
        if all(box[0] > t[2] + 2 or box[2] < t[0] - 2 or box[1] > t[3] +
               2 or box[3] < t[1] - 2 for t in taken):
            return box
    return None


def _shape_polygon(shape: str, box: Box) -> np.ndarray:
    """Integer polygon of a rectangle or an ellipse filling ``box``.

    Args:
        shape (str): ``'rectangle'`` or ``'ellipse'``.
        box (tuple): Inclusive ``(x0, y0, x1, y1)``.

    Returns:
        np.ndarray: ``int32[n, 2]`` vertices.
    """
    x0, y0, x1, y1 = box
    if shape == 'rectangle':
        return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.int32)
    center = ((x0 + x1) // 2, (y0 + y1) // 2)
    axes = ((x1 - x0) // 2, (y1 - y0) // 2)
    return cv2.ellipse2Poly(center, axes, 0, 0, 360, 10).astype(np.int32)


def _coco_image(
        rng: np.random.Generator,
        image_id: int,
        first_ann_id: int,
        size: Tuple[int,
                    int] = COCO_SIZE) -> Tuple[np.ndarray, dict, List[dict]]:
    """Draws one image and its annotations.

    Args:
        rng (np.random.Generator): The image's own generator.
        image_id (int): COCO image id.
        first_ann_id (int): Id of its first annotation.
        size (tuple[int, int]): Least and largest side in pixels.
            Defaults to ``COCO_SIZE``.

    Returns:
        tuple: BGR image, the ``images`` entry, the ``annotations`` entries.
    """
    from mmdet.datasets import CocoDataset
    classes = CocoDataset.METAINFO['classes']
    width, height = (
        int(v) for v in rng.integers(size[0], size[1] + 1, size=2))
    base = rng.integers(60, 200, size=3)
    noise = rng.normal(0.0, 12.0, size=(height, width, 3))
    img = np.clip(base + noise, 0, 255).astype(np.uint8)
    taken: List[Box] = []
    anns = []
    for _ in range(int(rng.integers(1, 5))):
        name, shape, colour, aspect = COCO_SHAPES[int(rng.integers(0, 4))]
        box = _place_box(rng, width, height, aspect, taken)
        if box is None:
            continue
        taken.append(box)
        poly = _shape_polygon(shape, box)
        mask = np.zeros((height, width), np.uint8)
        cv2.fillPoly(mask, [poly], 1)
        jitter = rng.integers(-20, 21, size=3)
        img[mask > 0] = np.clip(np.array(colour) + jitter, 0, 255)
        ys, xs = np.nonzero(mask)
        x0, y0 = int(xs.min()), int(ys.min())
        anns.append({
            'id':
            first_ann_id + len(anns),
            'image_id':
            image_id,
            'category_id':
            COCO_CATEGORY_IDS[classes.index(name)],
            'bbox': [x0, y0,
                     int(xs.max()) - x0 + 1,
                     int(ys.max()) - y0 + 1],
            'area':
            int(mask.sum()),
            'segmentation': [poly.reshape(-1).astype(float).tolist()],
            'iscrowd':
            0,
        })
    info = {
        'id': image_id,
        'file_name': f'{image_id:012d}.jpg',
        'width': width,
        'height': height
    }
    return img, info, anns


def coco_made_with(num_train: int, size: Tuple[int, int], seed: int) -> dict:
    """What the annotation files' ``info`` records of how they were made.

    Args:
        num_train (int): Train images.
        size (tuple[int, int]): Least and largest image side.
        seed (int): Random seed.

    Returns:
        dict: ``{'train_images', 'size', 'seed'}``.
    """
    return {'train_images': num_train, 'size': list(size), 'seed': seed}


def coco_is(root: Path, made_with: dict) -> bool:
    """Whether ``root`` holds a complete COCO set made with ``made_with``.

    Args:
        root (Path): The COCO folder.
        made_with (dict): From :func:`coco_made_with`.

    Returns:
        bool: True when both annotation files exist and record it.
    """
    if not all_exist(root, COCO_OUTPUTS):
        return False
    for name in COCO_OUTPUTS:
        info = json.loads((root / name).read_text()).get('info', {})
        if info.get('made_with') != made_with:
            return False
    return True


def make_coco(root: Path,
              num_train: int,
              num_val: int,
              seed: int,
              size: Tuple[int, int] = COCO_SIZE) -> None:
    """Writes ``root/{train2017,val2017,annotations}``.

    Args:
        root (Path): The COCO folder.
        num_train (int): Train images.
        num_val (int): Val images.
        seed (int): Random seed.
        size (tuple[int, int]): Least and largest image side in pixels
            (width and height are drawn independently). Defaults to
            ``COCO_SIZE``.

    Raises:
        ValueError: If not ``32 <= MIN <= MAX``.
    """
    if not 32 <= size[0] <= size[1]:
        raise ValueError(f'--coco-size: need 32 <= MIN <= MAX, got {size}')
    from mmdet.datasets import CocoDataset
    categories = [{
        'id': cid,
        'name': name,
        'supercategory': 'none'
    } for cid, name in zip(COCO_CATEGORY_IDS, CocoDataset.METAINFO['classes'])]
    (root / 'annotations').mkdir(parents=True, exist_ok=True)
    ann_id = 1
    splits = (('train2017', num_train), ('val2017', num_val))
    for split_no, (split, count) in enumerate(splits):
        (root / split).mkdir(exist_ok=True)
        images, annotations = [], []
        for i in range(count):
            image_id = split_no * 1_000_000 + i + 1
            img, info, anns = _coco_image(
                seeded_rng(seed, 0, split_no, i), image_id, ann_id, size)
            ann_id += len(anns)
            cv2.imwrite(
                str(root / split / info['file_name']), img,
                [cv2.IMWRITE_JPEG_QUALITY, 95])
            images.append(info)
            annotations.extend(anns)
        doc = {
            'info': {
                'description': 'fast_parallel sample data',
                'made_with': coco_made_with(num_train, size, seed)
            },
            'licenses': [],
            'images': images,
            'annotations': annotations,
            'categories': categories
        }
        path = root / 'annotations' / f'instances_{split}.json'
        path.write_text(json.dumps(doc))
