"""What several test modules share, imported as ``tests.helpers.<module>``: paths, backends on this host,
processes, generated corpora and hostile files, loopback S3/GCS servers, comparison helpers and workers
run in subprocesses."""
