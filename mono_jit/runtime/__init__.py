"""mono-jit's serving side: the HIP loader (`hip`), kernarg packing from cache metadata
(`kernargs`), the two backends (`backends`), the deployment grid (`kernels`), the all-rank
agreement (`agree`), peer memory (`peer`), vLLM's weights classes (`weights`) and the per-rank
runner (`runner`). It imports the cache but not the compile side: a cache miss compiles in a
worker process (mono_jit.resolution)."""
