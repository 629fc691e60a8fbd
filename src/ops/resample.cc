namespace kiln { void register_resample_ops() {} }
