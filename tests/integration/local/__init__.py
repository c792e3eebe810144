"""The local cluster (`kayos up`, LocalCluster) and one owner per data directory and port."""
