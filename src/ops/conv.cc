namespace kiln { void register_conv_ops() {} }
