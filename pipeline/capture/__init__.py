"""Internal. From a ``log()`` call to a typed record: the captured tuple, plain values, rich records, the converter."""
