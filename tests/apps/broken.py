raise RuntimeError("the dataset file is corrupt (raised on purpose by a test)")
