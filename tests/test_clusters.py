"""Past one machine, run for real: multi-node torchrun, a rank that dies,
and Slurm (tools/dist_train.sh, tools/slurm_train.sh; docs/clusters.md).

Every run trains the small YOLOX config on the sample images over gloo, one
CPU thread per process (torchrun sets ``OMP_NUM_THREADS=1`` only for more
than one process per node: the test sets it for every layout, or the
numbers differ in the last bits). Each rank writes what it trained
(``tests/record_hook.py``): its batches' sample ids, losses, gradient norms
and a hash of its final parameters.
"""
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from models import CONFIGS, ROOT
from runner_utils import checkpoint_tensors, fault_env, sample_config
from test_distributed import free_port

#: Ends a launch that hangs (the failures these tests look for).
LAUNCH_TIMEOUT = 300


def write_config(sample_data: Path, path: Path, fast: bool,
                 epochs: int) -> Path:
    """The YOLOX sample config (stock or fast), ``epochs`` epochs of 2
    iterations on 2 ranks, every rank's record and the fault hook on."""
    cfg = sample_config(
        CONFIGS['yolox'],
        sample_data,
        path.parent,
        fast=fast,
        train_cfg=dict(max_epochs=epochs, val_interval=100))
    cfg.custom_imports = dict(
        imports=list(cfg.get('custom_imports', {}).get('imports', [])) +
        ['record_hook', 'crash_hook'],
        allow_failed_imports=False)
    cfg.custom_hooks = list(cfg.get('custom_hooks', [])) + [
        dict(type='RankRecordHook'),
        dict(type='CrashAtIterHook')
    ]
    cfg.dump(str(path))
    return path


def records(folder: Path) -> list:
    """Each rank's record, by rank."""
    found = sorted(folder.glob('rank*.json'))
    return [json.loads(p.read_text()) for p in found]


def launch_env(record_dir: Path, **variables: str) -> dict:
    return fault_env(
        PYTHON=sys.executable,
        OMP_NUM_THREADS='1',
        FP_RECORD_DIR=str(record_dir),
        **variables)


def launch(args: list, env: dict) -> subprocess.Popen:
    """``args`` started in a session of its own (so that :func:`finish` can
    end all of it), output captured."""
    return subprocess.Popen(
        args,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True)


def dist_train(config: Path, work_dir: Path, procs: int, env: dict, *extra:
               str) -> subprocess.Popen:
    return launch([
        'bash', 'tools/dist_train.sh',
        str(config),
        str(procs), '--work-dir',
        str(work_dir), *extra
    ], env)


def finish(proc: subprocess.Popen, timeout: float = LAUNCH_TIMEOUT) -> str:
    """The launch's output once it ends; a launch still running after
    ``timeout`` seconds is killed whole (its session: torchrun, the ranks,
    their loader workers), so nothing of it outlives the test."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f'the launch hung for {timeout} s and was killed; '
                    f'its output:\n{out[-3000:]}')
    return out


def test_a_hung_launch_is_killed_whole(tmp_path):
    """A launch past its time ends with every process it started (here a
    shell and its two children), not only the shell."""
    marker = str(tmp_path / 'hung')
    sleeper = f'{sys.executable} -c "import time; time.sleep(600)" {marker}'
    proc = launch(['bash', '-c', f'{sleeper} & {sleeper} & wait', marker],
                  dict(os.environ))
    deadline = time.monotonic() + 10
    while len(_ours_running(marker)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(_ours_running(marker)) == 3  # the shell, both sleepers
    with pytest.raises(pytest.fail.Exception, match='hung for 1 s'):
        finish(proc, timeout=1)
    deadline = time.monotonic() + 10
    while _ours_running(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _ours_running(marker)


def assert_same_training(a: list, b: list, iters: slice = slice(None)):
    """Two runs' records: the same ranks, batches, losses, gradient norms
    and final parameters."""
    assert [r['rank'] for r in a] == [r['rank'] for r in b] == [0, 1]
    for ra, rb in zip(a, b):
        assert ra['world_size'] == rb['world_size'] == 2
        assert ra['order'][iters] == rb['order'][iters]
        assert ra['losses'][iters] == rb['losses'][iters]
        assert ra['grad_norm'][iters] == rb['grad_norm'][iters]
        assert ra['params'] == rb['params'] and ra['ema'] == rb['ema']
    assert a[0]['order'] != a[1]['order']  # each rank its own share


def test_two_nodes_train_as_one_node_with_two_processes(sample_data, tmp_path):
    """NNODES=2, NODE_RANK 0 and 1 (one process each, the fast path) train
    exactly as one node with two processes on the stock path: the same
    batches per rank, losses, gradient norms and final parameters."""
    port = str(free_port())
    fast = write_config(sample_data, tmp_path / 'fast.py', True, 1)
    stock = write_config(sample_data, tmp_path / 'stock.py', False, 1)
    nodes = [
        dist_train(
            fast, tmp_path / 'nodes', 1,
            launch_env(
                tmp_path / 'two_nodes',
                NNODES='2',
                NODE_RANK=str(rank),
                PORT=port,
                MASTER_ADDR='127.0.0.1')) for rank in (0, 1)
    ]
    outs = [finish(node) for node in nodes]
    assert all(node.returncode == 0 for node in nodes), outs[0][-3000:]
    one = dist_train(stock, tmp_path / 'one', 2,
                     launch_env(tmp_path / 'one_node', PORT=str(free_port())))
    out = finish(one)
    assert one.returncode == 0, out[-3000:]
    two_nodes, one_node = records(tmp_path / 'two_nodes'), records(tmp_path /
                                                                   'one_node')
    assert len(two_nodes[0]['order']) == 2  # 8 images, 2 per rank and step
    assert_same_training(two_nodes, one_node)


def _ours_running(marker: str) -> list:
    """Processes whose command line names ``marker`` (the run's config)."""
    found = []
    for pid in os.listdir('/proc'):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f'/proc/{pid}/cmdline').read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(pid))
    return found


def test_a_killed_rank_ends_the_run_and_resume_is_exact(sample_data, tmp_path):
    """Rank 1 is killed (SIGKILL) in epoch 2: the run ends within 60 s with
    torch's error, nothing of it left running, epoch 1's checkpoint intact;
    ``--resume`` from it trains epoch 2 as an uninterrupted run does."""
    config = write_config(sample_data, tmp_path / 'run.py', True, 2)
    whole = dist_train(
        config, tmp_path / 'whole', 2,
        launch_env(tmp_path / 'whole_rec', PORT=str(free_port())))
    out = finish(whole)
    assert whole.returncode == 0, out[-3000:]

    stamp = tmp_path / 'killed_at'
    killed = dist_train(
        config, tmp_path / 'killed', 2,
        launch_env(
            tmp_path / 'killed_rec',
            PORT=str(free_port()),
            FP_KILL_AT_ITER='3',
            FP_KILL_RANK='1',
            FP_KILL_STAMP=str(stamp)))
    out = finish(killed)
    ended = time.time()
    assert killed.returncode != 0
    assert stamp.exists(), out[-3000:]
    waited = ended - float(stamp.read_text())
    print(f'killed rank: the run ended {waited:.1f} s after the kill')
    assert waited < 60
    assert 'ChildFailedError' in out and 'Signal 9 (SIGKILL)' in out, \
        out[-3000:]
    deadline = time.monotonic() + 30  # loader workers see their parent go
    while _ours_running(str(config)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _ours_running(str(config))
    checkpoint = tmp_path / 'killed' / 'epoch_1.pth'
    assert checkpoint_tensors(checkpoint)  # loads (weights_only), intact
    assert not (tmp_path / 'killed' / 'epoch_2.pth').exists()

    resumed = dist_train(
        config, tmp_path / 'killed', 2,
        launch_env(tmp_path / 'resumed_rec', PORT=str(free_port())),
        '--resume')
    out = finish(resumed)
    assert resumed.returncode == 0, out[-3000:]
    log = ''.join(p.read_text() for p in (tmp_path / 'killed').glob('*/*.log'))
    assert 'will not be identical' not in log
    after, reference = records(tmp_path / 'resumed_rec'), records(tmp_path /
                                                                  'whole_rec')
    assert [r['start_iter'] for r in after] == [2, 2]
    assert_same_training(after, [
        dict(r, **{k: r[k][2:]
                   for k in ('order', 'losses', 'grad_norm')})
        for r in reference
    ])


# --- Slurm --------------------------------------------------------------

SLURM_BINARIES = ('munged', 'slurmctld', 'slurmd', 'srun', 'sinfo', 'scontrol')


def _slurm_missing() -> str:
    missing = [b for b in SLURM_BINARIES if shutil.which(b) is None]
    if missing:
        return (f'Slurm is not installed here ({", ".join(missing)} missing; '
                '`make test` installs Debian\'s slurm-wlm and munge where it '
                'can: as root, with apt-get)')
    if os.geteuid() != 0:
        return 'starting slurmd and munged here needs root'
    if not Path('/etc/munge/munge.key').exists():
        return 'no munge key (/etc/munge/munge.key)'
    return ''


def _slurm_conf(folder: Path, host: str, ctld_port: int, slurmd_port: int,
                cpus: int) -> str:
    return '\n'.join([
        'ClusterName=fptest',
        f'SlurmctldHost={host}(127.0.0.1)',
        f'SlurmctldPort={ctld_port}',
        f'SlurmdPort={slurmd_port}',
        'AuthType=auth/munge',
        f'AuthInfo=socket={folder}/munge.sock',
        'CredType=cred/munge',
        'SlurmUser=root',
        'SlurmdUser=root',
        f'StateSaveLocation={folder}/state',
        f'SlurmdSpoolDir={folder}/spool',
        f'SlurmctldPidFile={folder}/slurmctld.pid',
        f'SlurmdPidFile={folder}/slurmd.pid',
        f'SlurmctldLogFile={folder}/slurmctld.log',
        f'SlurmdLogFile={folder}/slurmd.log',
        'ProctrackType=proctrack/pgid',
        'TaskPlugin=task/none',
        'SelectType=select/cons_tres',
        'SelectTypeParameters=CR_CPU',
        'MpiDefault=none',
        'ReturnToService=2',
        'SwitchType=switch/none',
        'JobAcctGatherType=jobacct_gather/none',
        'AccountingStorageType=accounting_storage/none',
        f'NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 '
        'State=UNKNOWN',
        f'PartitionName=fptest Nodes={host} Default=YES MaxTime=INFINITE '
        'State=UP',
    ]) + '\n'


def _stop(folder: Path) -> None:
    """Stops the daemons whose pid files are in ``folder``."""
    for name in ('slurmd', 'slurmctld', 'munged'):
        pid_file = folder / f'{name}.pid'
        try:
            pid = int(pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                continue
            break


@pytest.fixture
def slurm_cluster():
    """A one-node Slurm cluster (munged, slurmctld, slurmd) with its
    configuration, state and sockets in a temporary folder, on free ports;
    stopped and removed at the end, whatever happens."""
    why = _slurm_missing()
    if why:
        pytest.skip(why)
    folder = Path(tempfile.mkdtemp(prefix='fp_slurm_'))
    try:
        (folder / 'state').mkdir()
        (folder / 'spool').mkdir()
        host = socket.gethostname().split('.')[0]
        conf = folder / 'slurm.conf'
        conf.write_text(
            _slurm_conf(folder, host, free_port(), free_port(),
                        os.cpu_count() or 1))
        env = dict(os.environ, SLURM_CONF=str(conf))
        subprocess.run([
            'munged', '--force', f'--socket={folder}/munge.sock',
            '--key-file=/etc/munge/munge.key',
            f'--pid-file={folder}/munged.pid',
            f'--log-file={folder}/munged.log',
            f'--seed-file={folder}/munge.seed'
        ],
                       check=True,
                       timeout=30)
        for daemon in ('slurmctld', 'slurmd'):
            subprocess.run([daemon, '-f', str(conf)],
                           env=env,
                           check=True,
                           timeout=30)
        deadline = time.monotonic() + 60
        state = ''
        while time.monotonic() < deadline:
            state = subprocess.run(['sinfo', '-h', '-o', '%t'],
                                   env=env,
                                   capture_output=True,
                                   text=True).stdout.strip()
            if state == 'idle':
                break
            time.sleep(0.5)
        assert state == 'idle', (state, (folder / 'slurmd.log').read_text() if
                                 (folder / 'slurmd.log').exists() else '')
        yield dict(partition='fptest', conf=str(conf), folder=folder)
    finally:
        _stop(folder)
        shutil.rmtree(folder, ignore_errors=True)


def test_slurm_train_fast_and_stock_give_the_same_numbers(
        sample_data, tmp_path, slurm_cluster):
    """tools/slurm_train.sh through a real slurmctld / slurmd: two tasks
    train over gloo, fast and --no-fast, with the same numbers."""
    config = write_config(sample_data, tmp_path / 'run.py', True, 1)
    outs = {}
    for name, extra in (('fast', []), ('stock', ['--no-fast'])):
        env = launch_env(
            tmp_path / f'{name}_rec',
            SLURM_CONF=slurm_cluster['conf'],
            GPUS='2',
            GPUS_PER_NODE='2',
            CPUS_PER_TASK='1',
            GRES='',
            MASTER_PORT=str(free_port()))
        done = launch([
            'bash', 'tools/slurm_train.sh', slurm_cluster['partition'],
            f'fp_{name}',
            str(config),
            str(tmp_path / name), *extra
        ], env)
        outs[name] = finish(done)
        assert done.returncode == 0, outs[name][-3000:]
    fast, stock = records(tmp_path / 'fast_rec'), records(tmp_path /
                                                          'stock_rec')
    assert_same_training(fast, stock)
    log = next((tmp_path / 'fast').glob('*/*.log')).read_text()
    assert 'Distributed launcher: slurm' in log
    assert 'FastParallelHook: on' in log
