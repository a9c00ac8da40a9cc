//! Generic Vulkan compute runtime on ash: devices, memory, pipelines, dispatch chains, timestamps.
