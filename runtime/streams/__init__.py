"""Several streams decoding at once with one Generator's models (`slots`), each pass shared by all of
them (`shared_pass`)."""
