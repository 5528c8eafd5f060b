"""Strategies: how K nodes turn local gradients into a shared model, through a Communicator."""
