"""What trains the model: samples and padded batches, chunked log-probs, the learner's
minibatch steps and guards, their statistics, and the value head of the learned-critic
methods. The math it applies lives in `loop.algo`."""
