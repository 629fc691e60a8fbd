namespace kiln { void register_index_ops() {} }
