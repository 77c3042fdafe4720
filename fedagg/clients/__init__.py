"""Local training: what a client does with the global model (batches, loss, optimizer), and client objectives."""
