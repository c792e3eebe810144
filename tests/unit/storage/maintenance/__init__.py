"""The store's upkeep: compaction, retention floors, salvage, the offline check and the digest."""
