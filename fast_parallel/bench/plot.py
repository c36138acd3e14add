"""Charts of ``tools/benchmark.py`` (``--plot``), PNG via matplotlib's Agg.

:func:`plot` draws the data path's results, :func:`plot_train` those of
``--train``.
"""
import os.path as osp

from fast_parallel.bench.datapath import PATHS


def plot_train(result: dict, path: str) -> None:
    """Bars of median iteration time and data_time per arm.

    Min-max whiskers on the iteration time; each arm is labelled with its
    number of measured iterations.

    Args:
        result (dict): The ``train`` results
            (:func:`~fast_parallel.bench.train_time.run_arms`).
        path (str): The PNG to write.
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    arms = list(result['arms'])
    r = result['arms']
    times = [r[a]['time_s'] * 1e3 for a in arms]
    spread = [[t - r[a]['min_time_s'] * 1e3 for a, t in zip(arms, times)],
              [r[a]['max_time_s'] * 1e3 - t for a, t in zip(arms, times)]]
    data = [r[a]['data_time_s'] * 1e3 for a in arms]
    x = range(len(arms))
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar([i - 0.2 for i in x],
           times,
           0.4,
           yerr=spread,
           capsize=4,
           label='iteration (median, min-max)')
    ax.bar([i + 0.2 for i in x], data, 0.4, label='data_time (median)')
    ax.set_xticks(list(x))
    ax.set_xticklabels([f'{a}\n{r[a]["iters"]} iterations' for a in arms],
                       fontsize=8)
    ax.set_ylabel('ms')
    ax.set_title(osp.basename(result['settings']['config']))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot(results: dict, path: str) -> None:
    """Charts of the data path, the worker-side collate and iterations.

    The data path: medians with quartile bars and batch counts; the
    worker-side collate time; with ``--configs``, whole iterations (medians,
    per-repeat range).

    Args:
        results (dict): What :func:`~fast_parallel.bench.datapath.measure`
            returns.
        path (str): The PNG to write.
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    panels = 3 if 'iterations' in results else 2
    fig, axes = plt.subplots(1, panels, figsize=(6 + 4 * panels, 4.5))
    labels, bars = [], {p: [] for p in PATHS}
    errs = {p: [[], []] for p in PATHS}
    for shape, by_workers in results['data_path'].items():
        for workers, r in by_workers.items():
            labels.append(f'{shape}\n{workers} workers\n'
                          f'n={r["samples"]}')
            for p in PATHS:
                bars[p].append(r[f'{p}_ms'])
                errs[p][0].append(r[f'{p}_ms'] - r[f'{p}_q1_ms'])
                errs[p][1].append(r[f'{p}_q3_ms'] - r[f'{p}_ms'])
    x = range(len(labels))
    ax = axes[0]
    for offset, p in ((-0.2, 'stock'), (0.2, 'fast')):
        ax.bar([i + offset for i in x],
               bars[p],
               0.4,
               yerr=errs[p],
               capsize=3,
               label=p)
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel('ms per batch (median, q1-q3)')
    ax.set_title('main process: next() to input on device')
    ax.legend()
    ax = axes[1]
    shapes = list(results['collate'])
    for offset, p in ((-0.2, 'stock'), (0.2, 'fast')):
        ax.bar([i + offset for i in range(len(shapes))],
               [results['collate'][s][f'{p}_ms'] for s in shapes],
               0.4,
               label=p)
    ax.set_xticks(list(range(len(shapes))))
    ax.set_xticklabels(shapes)
    ax.set_ylabel('ms per batch (median)')
    ax.set_title('worker: collate')
    ax.legend()
    if 'iterations' in results:
        ax = axes[2]
        kinds = list(results['iterations'])
        for offset, p in ((-0.2, 'stock'), (0.2, 'fast')):
            r = [results['iterations'][k][p] for k in kinds]
            med = [v['s_per_iter'] for v in r]
            lo = [m - min(v['per_repeat']) for m, v in zip(med, r)]
            hi = [max(v['per_repeat']) - m for m, v in zip(med, r)]
            ax.bar([i + offset for i in range(len(kinds))],
                   med,
                   0.4,
                   yerr=[lo, hi],
                   capsize=3,
                   label=p)
        ax.set_xticks(list(range(len(kinds))))
        ax.set_xticklabels(kinds)
        ax.set_ylabel('s per iteration (median, per-repeat range)')
        ax.set_title('whole training iteration')
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
