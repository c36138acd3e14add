"""The data path: packing, adapters, collate, the shared ring, the loader and
its state, rebuilding a started loader."""
