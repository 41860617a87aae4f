"""Device profiles (bandwidth, compute, memory, providers, with sources), bandwidth measurement
and the prediction of tokens/s and of the best γ."""
