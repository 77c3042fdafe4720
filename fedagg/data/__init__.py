"""Training data: dataset loaders, client partitions and their reports, device-resident batches."""
