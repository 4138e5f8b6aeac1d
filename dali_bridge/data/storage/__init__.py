"""Bytes by URL: ranged reads of objects in s3://, gs:// and http(s):// stores, batched, retried and
checked; listing many objects in few requests; presigned S3 GETs."""
