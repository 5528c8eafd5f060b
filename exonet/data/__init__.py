"""Datasets that live outside the process: sharded on S3 or in a folder, read lazily by each node.

    from exonet.data import S3Dataset, write_shards
    write_shards(dataset, "s3://bucket/digits", shard_size=4096)   # or "file:///data/digits", or a path
    trainer = LocalTrainer(model, S3Dataset("s3://bucket/digits"))

S3 needs the ``s3`` extra (boto3); a folder needs nothing. The format and why: exonet.data.shards;
storage, retries and errors: exonet.data.store; caching and the split across nodes: exonet.data.dataset;
in-memory tensors shared by every node instead of copied K times: exonet.data.shared.
"""

from exonet.data.dataset import S3Dataset
from exonet.data.shards import write_shards

__all__ = ["S3Dataset", "write_shards"]
