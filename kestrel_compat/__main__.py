"""``python -m kestrel_compat``: the Kestrel memcache front on 127.0.0.1:22133 by default."""

from kestrel_compat.cli import kestrel

if __name__ == "__main__":
    kestrel(prog_name="python -m kestrel_compat")
