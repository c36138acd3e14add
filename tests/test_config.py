"""fast_parallel/config.py: ``enable`` on the forms of config mmengine accepts.
"""
import pytest
from mmengine.config import Config
from mmengine.utils import import_modules_from_strings

import fast_parallel
from fast_parallel.config import is_enabled


@pytest.mark.parametrize('imports,expected', [
    ('json.decoder', ['json.decoder', 'fast_parallel']),
    (['json.decoder'], ['json.decoder', 'fast_parallel']),
    ('fast_parallel', ['fast_parallel']),
    (('json.decoder', 'fast_parallel'), ['json.decoder', 'fast_parallel']),
])
def test_enable_keeps_custom_imports_a_list_of_module_names(imports, expected):
    cfg = Config(dict(custom_imports=dict(imports=imports)))
    fast_parallel.enable(cfg)
    assert cfg.custom_imports['imports'] == expected
    assert cfg.custom_imports['allow_failed_imports'] is False
    # what mmengine's Runner does with it: every name imports
    modules = import_modules_from_strings(**cfg.custom_imports)
    assert [m.__name__ for m in modules] == expected
    assert is_enabled(cfg)
