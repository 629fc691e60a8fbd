namespace kiln { void register_binary_ops() {} }
