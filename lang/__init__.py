"""radixlm: a structured-generation program runtime."""
