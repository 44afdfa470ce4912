"""forkserve's benchmark scenarios, one script each, written on benchmarks.harness;
benchmarks/README.md lists them with the command that runs each."""
