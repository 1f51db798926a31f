"""What a run writes: the HDF5 run log, the schema of every stream, the TensorBoard mirror."""
