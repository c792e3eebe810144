"""The Kestrel front's codecs: memcache, text and thrift framing, GET options, reply bytes."""
