#!/bin/sh
# A stand-in for the reader's own program (./train, ./batch-job) in the examples of
# `cupool exec --help`: tests/docs/doc_test.py runs them with this in its place.
echo "$0: a stand-in for your program ($*)"
