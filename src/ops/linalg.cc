namespace kiln { void register_linalg_ops() {} }
