"""mono-jit's serving side: what one TP rank needs to run the decode layer's kernels from the
cache (load them, pack their arguments, agree across ranks, share peer memory, check vLLM's
weights, run the layer). It imports the cache but not the compile side: a cache miss compiles
in a worker process (mono_jit.pipeline.resolve)."""
