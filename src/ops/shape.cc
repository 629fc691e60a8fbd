namespace kiln { void register_shape_ops() {} }
