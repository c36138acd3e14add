"""fast_parallel: packed batches and native scatter for mmdet / mmdet3d."""
from pathlib import Path
from typing import List

from setuptools import find_packages, setup

HERE = Path(__file__).parent


def read_requirements(name: str) -> List[str]:
    """Reads one ``requirements/*.txt`` file, without comments.

    Args:
        name (str): The file's stem, e.g. ``'runtime'``.

    Returns:
        list[str]: The requirement lines.
    """
    lines = (HERE / 'requirements' / f'{name}.txt').read_text().splitlines()
    return [
        ln.strip() for ln in lines if ln.strip() and not ln.startswith('#')
    ]


setup(
    name='fast_parallel',
    version='0.1.0',
    description='Packed batches and native-scatter data parallelism for '
    'mmdet / mmdet3d',
    long_description=(HERE / 'README.md').read_text(),
    long_description_content_type='text/markdown',
    packages=find_packages(include=['fast_parallel', 'fast_parallel.*']),
    license='Apache-2.0',
    python_requires='>=3.8',
    # Ranges (requirements/package*.txt): installing into an environment
    # that has torch, mmcv & co. replaces none of them. The exact pins of
    # this project's own environment are requirements/constraints.txt.
    install_requires=read_requirements('package'),
    extras_require={
        'tests':
        read_requirements('tests'),
        'mmdet3d':
        read_requirements('package-mmdet3d') +
        read_requirements('mmdet3d-deps'),
    },
)
