"""The data path's report (``tools/benchmark.py``): warnings and tables.

:func:`noise_warnings` says where a ratio is within the noise;
:func:`format_report` prints the results of
:func:`~fast_parallel.bench.datapath.measure` as Markdown tables.
"""
from typing import List

from fast_parallel.bench.datapath import PATHS

#: A spread ((q3 - q1) / median) above which the report warns.
NOISY = 0.25


def noise_warnings(results: dict, quick: bool) -> List[str]:
    """Warnings a reader needs before trusting a ratio of the data path.

    Args:
        results (dict): The results, with their ``data_path`` section.
        quick (bool): Whether ``--quick`` made them.

    Returns:
        list[str]: One line per warning.
    """
    out = []
    if quick:
        out.append('--quick: a few batches, one repeat: a check that the '
                   'tool works, not a measurement')
    for shape, by_workers in results['data_path'].items():
        for workers, r in by_workers.items():
            q = {p: (r[f'{p}_q1_ms'], r[f'{p}_q3_ms']) for p in PATHS}
            where = f'{shape}, {workers} workers'
            if q['stock'][0] <= q['fast'][1] and q['fast'][0] <= \
                    q['stock'][1]:
                out.append(f'{where}: the quartile ranges of stock '
                           f'({q["stock"][0]:.2f}-{q["stock"][1]:.2f} ms) '
                           f'and fast ({q["fast"][0]:.2f}-'
                           f'{q["fast"][1]:.2f} ms) overlap: the ratio is '
                           'within the noise')
                continue
            for path in PATHS:
                spread = (q[path][1] - q[path][0]) / r[f'{path}_ms']
                if spread > NOISY:
                    out.append(f'{where}, {path}: quartiles {q[path][0]:.2f}'
                               f'-{q[path][1]:.2f} ms, {spread:.0%} of the '
                               'median: the ratio\'s size is uncertain (its '
                               'direction is not: the ranges do not overlap)')
    return out


def format_report(results: dict) -> str:
    """Markdown tables of the results.

    Args:
        results (dict): What :func:`~fast_parallel.bench.datapath.measure`
            returns, with ``warnings``.

    Returns:
        str: The tables, then one ``WARNING:`` line per warning.
    """
    lines = [
        '## Main-process data path per batch (median, quartiles, '
        'min-max)', '',
        '| batch | workers | stock ms | stock q1-q3 | stock min-max | '
        'fast ms | fast q1-q3 | fast min-max | fast / stock | batches |',
        '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: '
        '| ---: |'
    ]

    def spread(r: dict, path: str) -> str:
        return (f'{r[f"{path}_q1_ms"]:.2f}-{r[f"{path}_q3_ms"]:.2f} | '
                f'{r[f"{path}_min_ms"]:.2f}-{r[f"{path}_max_ms"]:.2f}')

    for shape, by_workers in results['data_path'].items():
        for workers, r in by_workers.items():
            lines.append(f'| {shape} | {workers} | {r["stock_ms"]:.2f} | '
                         f'{spread(r, "stock")} | {r["fast_ms"]:.2f} | '
                         f'{spread(r, "fast")} | {r["ratio"]:.2f} | '
                         f'{r["samples"]} |')
    lines += [
        '', '## Worker-side collate, copies and bytes per batch', '',
        '| batch | collate stock ms | collate fast ms | copies stock |'
        ' copies fast | bytes stock | bytes fast |',
        '| --- | ---: | ---: | ---: | ---: | ---: | ---: |'
    ]
    for shape, c in results['collate'].items():
        t = results['transfers'][shape]
        lines.append(f'| {shape} | {c["stock_ms"]:.2f} | {c["fast_ms"]:.2f} '
                     f'| {t["stock"]["copies"]} | {t["fast"]["copies"]} | '
                     f'{t["stock"]["bytes"]:,} | {t["fast"]["bytes"]:,} |')
    if 'iterations' in results:
        lines += [
            '', '## Full training iterations (small configs)', '',
            '| config | stock s/iter | fast s/iter | stock samples/s |'
            ' fast samples/s | fast / stock time | per-repeat stock |'
            ' per-repeat fast |',
            '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |'
        ]
        for kind, r in results['iterations'].items():
            spread = {
                p: ', '.join(f'{t:.3f}' for t in r[p].get('per_repeat', []))
                for p in PATHS
            }
            lines.append(
                f'| {kind} | {r["stock"]["s_per_iter"]:.3f} | '
                f'{r["fast"]["s_per_iter"]:.3f} | '
                f'{r["stock"]["samples_per_s"]:.2f} | '
                f'{r["fast"]["samples_per_s"]:.2f} | {r["ratio"]:.2f} | '
                f'{spread["stock"]} | {spread["fast"]} |')
    gpu = results['gpu']
    lines += ['', '## GPU', '']
    if gpu['run']:
        lines.append(f'{gpu["device"]}: pinned host-to-device '
                     f'{gpu["pinned_h2d_bytes_per_s"] / 1e9:.1f} GB/s, '
                     f'{gpu["gpus"]} GPU(s)')
    else:
        lines.append(f'not run: {gpu["reason"]}')
    lines += [''] + [f'WARNING: {w}' for w in results.get('warnings', [])]
    return '\n'.join(lines)
