"""What trains the model: samples and padded batches, chunked log-probs, the learner's
minibatch steps and guards, the policy loss its settings choose, their statistics (the
sampler-learner mismatch included), the value head of the learned-critic methods, the memory
stress test, and an iteration's steps 4-5 as one call (update.py). The math it applies lives in
`loop.algo`."""
