"""The pipeline's stages as plain functions: records in, records out; eagle_data/defs/ builds assets from them."""
