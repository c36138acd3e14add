"""tools/benchmark.py runs in quick mode and writes well-formed JSON.

No timing is asserted: speed is reported by the benchmark, not tested.
"""
import json

from conftest import load_tool

benchmark = load_tool('benchmark')


def test_quick_mode_writes_complete_json(tmp_path):
    out, png = tmp_path / 'bench.json', tmp_path / 'bench.png'
    benchmark.main(['--quick', '--json', str(out), '--plot', str(png)])
    results = json.loads(out.read_text())
    assert set(results) >= {'machine', 'settings', 'data_path', 'collate',
                            'transfers', 'gpu'}
    assert results['settings']['step_kind'] == 'torch'
    for shape in ('yolox', 'pointpillars'):
        by_workers = results['data_path'][shape]
        assert set(by_workers) == {'0', '2'}
        for r in by_workers.values():
            assert r['stock_ms'] > 0 and r['fast_ms'] > 0
            assert r['ratio'] == r['fast_ms'] / r['stock_ms']
            assert r['samples'] == results['settings']['batches']
        copies = results['transfers'][shape]
        assert copies['fast']['copies'] < copies['stock']['copies']
        assert copies['fast']['bytes'] >= copies['stock']['bytes']
    assert results['transfers']['yolox']['stock']['copies'] == 40
    assert results['gpu']['run'] in (True, False)
    assert png.stat().st_size > 1000
