namespace kiln { void register_attention_ops() {} }
