"""URIs and stores: the one routing rule (uris.store_of), single-file stores, Azure, output paths, the run lock."""
