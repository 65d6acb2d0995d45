"""The search: the tuner loop, samplers, the quantization model, verification, timers, isolation, orchestration."""
