"""The data path: packing, adapters, collate, the shared ring, the loader,
rebuilding a started loader."""
