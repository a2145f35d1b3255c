"""From a template and a spec to a verified cache entry: the build job, the lookup, a miss,
prebuild, the deployment, the compile workers and the toolchain. Empty on purpose: a cache hit
imports resolve and job only, never the workers or the compiler."""
