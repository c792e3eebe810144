"""What a replica serves consumers: snapshots only from committed marks, confirmed up to a head
that holds its lease, and read-back pieces as of their own seq."""
