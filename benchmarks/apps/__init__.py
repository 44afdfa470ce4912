"""The apps, wrk scripts and server configs the scenarios in benchmarks/ run."""
